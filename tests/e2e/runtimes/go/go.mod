module flightlock.test/goruntime

go 1.19
