// go-mcp: a small MCP server built on the official Go SDK, used by the end-to-end tests as
// a third-party upstream of Quiver. It serves MCP over stdio by default, or over
// Streamable HTTP at /mcp with -http ADDR.
//
// Tools: echo {text}, add {a, b}, whoami {}, slow {ms}.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const maxSlow = 60 * time.Second

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to send back"`
}

type addIn struct {
	A int `json:"a" jsonschema:"the first addend"`
	B int `json:"b" jsonschema:"the second addend"`
}

type whoamiIn struct{}

type slowIn struct {
	Ms int `json:"ms" jsonschema:"how long to sleep, in milliseconds (at most 60000)"`
}

// text is a tool result made of one text content block.
func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func newServer(transport string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "go-upstream", Version: "1.0.0"}, nil)

	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Returns the text it is given."},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return text(in.Text), nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "Adds two integers."},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, any, error) {
			return text(strconv.Itoa(in.A + in.B)), nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "Names the serving process: pid, transport and host."},
		func(context.Context, *mcp.CallToolRequest, whoamiIn) (*mcp.CallToolResult, any, error) {
			host, _ := os.Hostname()
			return text(fmt.Sprintf("pid=%d transport=%s host=%s", os.Getpid(), transport, host)), nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "Sleeps for ms milliseconds (at most 60000), then answers done."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
			d := min(max(time.Duration(in.Ms)*time.Millisecond, 0), maxSlow)
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return text("done"), nil, nil
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		})

	return s
}

func main() {
	addr := flag.String("http", "", "serve Streamable HTTP at `ADDR` (path /mcp) instead of stdio")
	stateless := flag.Bool("stateless", false, "with -http: no sessions (no Mcp-Session-Id, no GET stream)")
	jsonResp := flag.Bool("json", false, "with -http: answer POSTs with application/json instead of SSE")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("go-mcp: ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *addr == "" {
		if err := newServer("stdio").Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
			log.Fatal(err)
		}
		return
	}

	server := newServer("http")
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: *stateless, JSONResponse: *jsonResp})
	mux := http.NewServeMux()
	mux.Handle("/mcp", handler)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("serving MCP over Streamable HTTP at %s/mcp", *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
