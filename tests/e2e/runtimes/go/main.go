// A Go Lambda runtime for the end-to-end tests: Go's own encoding/json reads the client context
// into the shape aws-lambda-go declares (lambdacontext.ClientContext), with the call its invoke
// loop makes (json.Unmarshal of the Lambda-Runtime-Client-Context header). Standard library only:
// aws-lambda-go itself cannot be fetched here, and what is under test is encoding/json's reading.
//
//	bootstrap          a custom runtime (provided.al2023): a loop on $AWS_LAMBDA_RUNTIME_API whose
//	                   handler answers {"ticket","requestId","clientContext"} as the other test
//	                   runtimes' {"mode":"context"} does; an unreadable context fails the
//	                   invocation, as aws-lambda-go does
//	bootstrap read     a reader for the property test: each line of stdin is a client context in
//	                   base64; each line of stdout is {"ok":true,"custom":{...}} or
//	                   {"ok":false,"error":"..."}
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// ClientApplication and ClientContext are declared as aws-lambda-go's lambdacontext package
// declares them: Client has no tag (so "client" matches by case-insensitive folding too).
type ClientApplication struct {
	InstallationID string `json:"installation_id"`
	AppTitle       string `json:"app_title"`
	AppVersionCode string `json:"app_version_code"`
	AppPackageName string `json:"app_package_name"`
}

type ClientContext struct {
	Client ClientApplication
	Env    map[string]string `json:"env"`
	Custom map[string]string `json:"custom"`
}

func decode(text []byte) (ClientContext, error) {
	var cc ClientContext
	err := json.Unmarshal(text, &cc)
	return cc, err
}

func read() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		text, err := base64.StdEncoding.DecodeString(strings.TrimSpace(in.Text()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bootstrap read: a line is not base64:", err)
			os.Exit(2)
		}
		cc, err := decode(text)
		if err != nil {
			_ = enc.Encode(map[string]interface{}{"ok": false, "error": err.Error()})
			continue
		}
		custom := cc.Custom
		if custom == nil {
			custom = map[string]string{}
		}
		_ = enc.Encode(map[string]interface{}{"ok": true, "custom": custom})
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "bootstrap read:", err)
		os.Exit(2)
	}
}

func post(url string, body []byte, errorType string) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if errorType != "" {
		req.Header.Set("Lambda-Runtime-Function-Error-Type", errorType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func serve() {
	api := os.Getenv("AWS_LAMBDA_RUNTIME_API")
	if api == "" {
		fmt.Fprintln(os.Stderr, "bootstrap: AWS_LAMBDA_RUNTIME_API is not set")
		os.Exit(1)
	}
	if !strings.Contains(api, "://") {
		api = "http://" + api
	}
	base := api + "/2018-06-01/runtime/invocation/"
	for {
		resp, err := http.Get(base + "next")
		if err != nil {
			fmt.Fprintln(os.Stderr, "bootstrap: next:", err)
			os.Exit(1)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		id := resp.Header.Get("Lambda-Runtime-Aws-Request-Id")
		var answer []byte
		errorType := ""
		var cc ClientContext
		if header := resp.Header.Get("Lambda-Runtime-Client-Context"); header != "" {
			cc, err = decode([]byte(header))
		}
		if err != nil {
			errorType = "ClientContextUnreadable"
			answer, _ = json.Marshal(map[string]string{"errorType": errorType, "errorMessage": err.Error()})
		} else {
			var ticket interface{}
			if t, ok := cc.Custom["flightlockTicket"]; ok {
				ticket = t
			}
			answer, _ = json.Marshal(map[string]interface{}{
				"ticket":        ticket,
				"requestId":     id,
				"runtime":       "go",
				"clientContext": map[string]interface{}{"client": cc.Client, "env": cc.Env, "custom": cc.Custom},
			})
		}
		url := base + id + "/response"
		if errorType != "" {
			url = base + id + "/error"
		}
		if err := post(url, answer, errorType); err != nil {
			fmt.Fprintln(os.Stderr, "bootstrap: answer:", err)
			os.Exit(1)
		}
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "read" {
		read()
		return
	}
	serve()
}
