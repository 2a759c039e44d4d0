//! The mutation suite: each availability check, and each guarantee it stands beside, must catch
//! a deliberately broken protocol within the seeds CI runs. A mutation that survives fails here.
