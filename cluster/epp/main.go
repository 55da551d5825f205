// epp-pick asks an endpoint picker which pod should serve one request, as Envoy does: it is an
// Envoy external-processing (ext-proc) client that sends the request's headers and body and
// prints the endpoint the picker chose (the x-gateway-destination-endpoint header it sets).
// cluster/epp.sh builds it beside the picker itself (the Gateway API Inference Extension's
// cmd/epp, from the same module version).
//
//	epp-pick --addr 127.0.0.1:9002 --path /v1/completions --body '{"model": ..., "prompt": ...}'
//	epp-pick --addr 127.0.0.1:9002 --lines   (one JSON body a line on stdin, one answer a line
//	                                          on stdout: the endpoint, or "error: ...")
//	epp-pick --lines --with-body             (each answer a JSON object: "endpoint" and "body",
//	                                          the body as the picker rewrote it, as Envoy would
//	                                          forward it; or "error")
//	epp-pick --header x-prefiller-host-port ...  (the endpoint, a space, and the value the picker
//	                                          set for that header too, "-" if none: llm-d's P/D;
//	                                          with --with-body, the JSON's "header")
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "the picker's ext-proc address")
	path := flag.String("path", "/v1/completions", "the request's path")
	body := flag.String("body", "", "the request's JSON body")
	plaintext := flag.Bool("plaintext", false, "no TLS (a picker run with --secure-serving=false)")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after (per request)")
	lines := flag.Bool("lines", false, "pick for each line of stdin (a JSON body) over one connection")
	withBody := flag.Bool("with-body", false, "answer with the endpoint and the body the picker forwards, as JSON")
	header := flag.String("header", "", "also print the value the picker set for this request header")
	flag.Parse()
	// The picker serves a self-signed certificate, which Envoy does not check either.
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec
	if *plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(os.Stderr, "epp-pick: %v\n", err)
		os.Exit(1)
	}
	defer conn.Close()
	if *lines {
		pickLines(conn, *path, *timeout, *withBody, *header)
		return
	}
	routed, err := pick(conn, *path, []byte(*body), *timeout, *withBody, *header)
	if err != nil {
		fmt.Fprintf(os.Stderr, "epp-pick: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(answer(routed, nil, *withBody, *header))
}

// routed is where the picker sends a request, and the body it forwards there (with --with-body).
type routed struct {
	Endpoint string `json:"endpoint,omitempty"`
	Body     string `json:"body,omitempty"`
	Header   string `json:"header,omitempty"` // the value set for --header, "-" if none
	Error    string `json:"error,omitempty"`
}

func answer(r routed, err error, withBody bool, header string) string {
	if err != nil {
		r = routed{Error: strings.ReplaceAll(err.Error(), "\n", " ")}
	}
	if !withBody {
		if r.Error != "" {
			return "error: " + r.Error
		}
		if header != "" {
			return r.Endpoint + " " + r.Header
		}
		return r.Endpoint
	}
	encoded, _ := json.Marshal(r)
	return string(encoded)
}

// pickLines answers each body on stdin in order, one line each, until stdin ends: a caller that
// picks for many requests keeps one connection (a process per pick would add its start-up).
func pickLines(conn *grpc.ClientConn, path string, timeout time.Duration, withBody bool, header string) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		r, err := pick(conn, path, in.Bytes(), timeout, withBody, header)
		fmt.Fprintln(out, answer(r, err, withBody, header))
		_ = out.Flush()
	}
}

// pick sends one request's headers and body and reads the picker's answers: the endpoint (a
// header it sets), the value of the header named (if any) and, with withBody, the body it streams back whole (rewritten, e.g. its model
// by an InferenceModelRewrite), up to its end of stream.
func pick(conn *grpc.ClientConn, path string, body []byte, timeout time.Duration, withBody bool, header string) (routed, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return routed{}, err
	}
	headers := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": path, ":authority": "inference", "content-type": "application/json"} {
		headers.Headers = append(headers.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	requests := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, r := range requests {
		if err := stream.Send(r); err != nil {
			return routed{}, fmt.Errorf("sending to the picker: %w", err)
		}
	}
	var result routed
	if header != "" {
		result.Header = "-"
	}
	var forwarded []byte
	for {
		response, err := stream.Recv()
		if err != nil {
			return routed{}, fmt.Errorf("the picker's answer: %w", err)
		}
		if immediate := response.GetImmediateResponse(); immediate != nil {
			return routed{}, fmt.Errorf("the picker refused the request: %d %s", immediate.GetStatus().GetCode(), immediate.GetBody())
		}
		var common *extprocv3.CommonResponse
		switch {
		case response.GetRequestHeaders() != nil:
			common = response.GetRequestHeaders().GetResponse()
		case response.GetRequestBody() != nil:
			common = response.GetRequestBody().GetResponse()
		}
		for _, h := range common.GetHeaderMutation().GetSetHeaders() {
			value := string(h.GetHeader().GetRawValue())
			if value == "" {
				value = h.GetHeader().GetValue()
			}
			switch key := h.GetHeader().GetKey(); {
			case key == metadata.DestinationEndpointKey:
				result.Endpoint = value
			case header != "" && strings.EqualFold(key, header) && value != "":
				result.Header = value
			}
		}
		streamed := common.GetBodyMutation().GetStreamedResponse()
		forwarded = append(forwarded, streamed.GetBody()...)
		if whole := common.GetBodyMutation().GetBody(); whole != nil {
			forwarded, streamed = whole, &extprocv3.StreamedBodyResponse{EndOfStream: true}
		}
		if result.Endpoint != "" && (!withBody || streamed.GetEndOfStream()) {
			result.Body = string(forwarded)
			return result, nil
		}
	}
}
