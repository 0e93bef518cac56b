// A plugin that answers every event koordnode subscribes to with no change: the floor of
// containerd's own NRI cost per pod start (measurement only).
package main

import (
	"context"
	"flag"
	"log"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type noop struct{}

func (noop) RunPodSandbox(context.Context, *api.PodSandbox) error    { return nil }
func (noop) StopPodSandbox(context.Context, *api.PodSandbox) error   { return nil }
func (noop) RemovePodSandbox(context.Context, *api.PodSandbox) error { return nil }
func (noop) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}
func (noop) PostStartContainer(context.Context, *api.PodSandbox, *api.Container) error { return nil }
func (noop) UpdateContainer(context.Context, *api.PodSandbox, *api.Container, *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	return nil, nil
}
func (noop) PostUpdateContainer(context.Context, *api.PodSandbox, *api.Container) error { return nil }
func (noop) StopContainer(context.Context, *api.PodSandbox, *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}
func (noop) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error { return nil }

func main() {
	socket := flag.String("socket", "", "NRI socket")
	flag.Parse()
	s, err := stub.New(noop{}, stub.WithPluginName("noop"), stub.WithPluginIdx("10"), stub.WithSocketPath(*socket))
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
