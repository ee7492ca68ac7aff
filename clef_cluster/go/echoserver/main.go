// Command echoserver is the real node's test workload, shipped FROM scratch:
//
//	echoserver serve    serve HTTP on $PORT (default 8080): GET /healthz answers "ok", any other path answers
//	              {"pod": $HOSTNAME, "path": ...}; every request is logged to stdout
//	echoserver dial A   try a TCP connection to address A (host:port) for 3 s; print the outcome, exit 1 on failure
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "dial" {
		conn, err := net.DialTimeout("tcp", os.Args[2], 3*time.Second)
		if err != nil {
			fmt.Println("dial failed:", err)
			os.Exit(1)
		}
		conn.Close()
		fmt.Println("dial succeeded")
		return
	}
	if len(os.Args) != 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: echoserver serve | echoserver dial HOST:PORT")
		os.Exit(2)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	logger := log.New(os.Stdout, "", log.LstdFlags)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		logger.Printf("request %s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"pod": os.Getenv("HOSTNAME"), "path": r.URL.Path})
	})
	logger.Printf("serving on :%s", port)
	logger.Fatal(http.ListenAndServe(":"+port, mux))
}
