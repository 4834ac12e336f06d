// Command prom-text-check parses Prometheus text exposition from stdin with
// Prometheus' own Go parser (github.com/prometheus/common/expfmt, the one the
// Prometheus server's text scrape path is built on) and prints every family
// as one JSON line: name, type, help and the sorted label names of its
// samples (without the histogram's "le"). A parse error exits 1 with the
// parser's message. Built by the tests from Debian's packages:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o prom-text-check main.go
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
)

type family struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Help   string   `json:"help"`
	Labels []string `json:"labels"`
	Series int      `json:"series"`
}

func main() {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	out := json.NewEncoder(os.Stdout)
	for _, name := range names {
		mf := families[name]
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		sorted := make([]string, 0, len(labels))
		for l := range labels {
			sorted = append(sorted, l)
		}
		sort.Strings(sorted)
		f := family{
			Name:   name,
			Type:   strings.ToLower(mf.GetType().String()),
			Help:   mf.GetHelp(),
			Labels: sorted,
			Series: len(mf.GetMetric()),
		}
		if err := out.Encode(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
