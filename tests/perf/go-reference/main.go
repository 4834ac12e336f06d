// The reference NRI plugin of the performance table: the same cpuset
// adjustment dra-cpu's nri-plugin makes for a shared container (every
// allocatable CPU, no claims), written with the official Go NRI stub.
// perf-table compares container create+start with it registered against
// nri-plugin registered and against no plugin at all.
//
// scripts/perf.sh builds it once per runtime, with the NRI module version
// that runtime was built with, in a throwaway module:
//
//	go mod init dra-cpu.local/nri-go-reference
//	go get github.com/containerd/nri@v0.6.1 && go build -o nri-go-reference .
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	cpus string
}

// Synchronize announces on stdout that the plugin is registered, which is
// what perf-table waits for.
func (p *plugin) Synchronize(_ context.Context, _ []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	fmt.Println("synchronized")
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adjust := &api.ContainerAdjustment{}
	adjust.SetLinuxCPUSetCPUs(p.cpus)
	return adjust, nil, nil
}

func main() {
	socket := flag.String("nri-socket", "/var/run/nri/nri.sock", "NRI socket of the runtime")
	cpus := flag.String("cpus", "", "cpulist given to every container")
	flag.Parse()
	if *cpus == "" {
		fmt.Fprintln(os.Stderr, "--cpus is required")
		os.Exit(2)
	}
	p := &plugin{cpus: *cpus}
	s, err := stub.New(p,
		stub.WithPluginName("go-reference"),
		stub.WithPluginIdx("10"),
		stub.WithSocketPath(*socket),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating the stub:", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "plugin stopped:", err)
		os.Exit(1)
	}
}
