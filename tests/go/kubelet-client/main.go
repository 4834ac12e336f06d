// kubelet-client calls a DRA driver's kubelet plugin the way a real kubelet
// does, with grpc-go and kubelet's own dial options, so that tests see what
// the Rust stand-in cannot: the HTTP/2 frames grpc-go sends, in particular
// its `:authority`.
//
// It builds offline from Debian's packages in GOPATH mode:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o kubelet-client main.go
//
// with golang-google-grpc-dev and golang-google-protobuf-dev installed.
// Debian ships no Go package with kubelet's pluginregistration or DRA API, so
// the few messages are encoded and decoded here with protowire and sent with
// a codec that passes bytes through.
//
// Steps, each printed as one JSON line on stdout ({"step": ..., ...}); the
// first failure is printed as {"step": ..., "error": ...} and exits 1:
//
//  1. GetInfo and NotifyRegistrationStatus on the registration socket,
//  2. NodePrepareResources and NodeUnprepareResources of one claim on the
//     endpoint GetInfo returned (when -claim-uid is set),
//  3. the first message of v1alpha1.DRAResourceHealth/NodeWatchResources
//     (when -health is set).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// Kubelet's deadlines: registration dial 10 s, GetInfo 1 s, Notify 5 s
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go), DRA
// calls 45 s (pkg/kubelet/cm/dra/plugin, defaultClientCallTimeout).
const (
	dialTimeout    = 10 * time.Second
	getInfoTimeout = 1 * time.Second
	notifyTimeout  = 5 * time.Second
	draCallTimeout = 45 * time.Second
)

// rawCodec sends and receives messages already encoded as protobuf bytes.
// Its name is "proto", so the content type is application/grpc+proto as with
// generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// report prints one step's result as a JSON line.
func report(fields map[string]any) {
	line, err := json.Marshal(fields)
	if err != nil {
		fmt.Fprintf(os.Stderr, "encoding report: %v\n", err)
		os.Exit(2)
	}
	fmt.Println(string(line))
}

func fail(step string, err error) {
	report(map[string]any{"step": step, "error": err.Error()})
	os.Exit(1)
}

// dialRegistration is kubelet's registration dial: the socket path as the
// target, no authority option, so grpc-go's passthrough resolver sends the
// path, percent-encoded, as the HTTP/2 :authority. Copied in substance from
// func dial in kubernetes pkg/kubelet/pluginmanager/operationexecutor/
// operation_generator.go (1.34 to 1.37).
func dialRegistration(ctx context.Context, unixSocketPath string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	return grpc.DialContext(ctx, unixSocketPath,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

// dialDRA is kubelet's DRA plugin connection: grpc.NewClient on
// "unix:"+endpoint with insecure credentials and a unary interceptor, as in
// func (pm *DRAPluginManager) add of kubernetes
// pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go (1.34 to 1.37; kubelet's
// interceptor records metrics, this one only passes the call on; kubelet's
// stats handler only watches the connection state).
func dialDRA(endpoint string) (*grpc.ClientConn, error) {
	passOn := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return grpc.NewClient("unix:"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(passOn),
	)
}

func invoke(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration, method string, request []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reply []byte
	err := conn.Invoke(ctx, method, &request, &reply, grpc.ForceCodec(rawCodec{}))
	return reply, err
}

// field is one decoded protobuf field: bytes for length-delimited fields,
// the number for varints.
type field struct {
	bytes  []byte
	varint uint64
}

// fields decodes a message into its fields by number, in order.
func fields(msg []byte) (map[protowire.Number][]field, error) {
	out := map[protowire.Number][]field{}
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		var f field
		switch typ {
		case protowire.BytesType:
			f.bytes, n = protowire.ConsumeBytes(msg)
		case protowire.VarintType:
			f.varint, n = protowire.ConsumeVarint(msg)
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		out[num] = append(out[num], f)
	}
	return out, nil
}

func strings(fs []field) []string {
	out := []string{}
	for _, f := range fs {
		out = append(out, string(f.bytes))
	}
	return out
}

func first(fs []field) string {
	if len(fs) == 0 {
		return ""
	}
	return string(fs[0].bytes)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// claimsRequest encodes NodePrepareResourcesRequest and
// NodeUnprepareResourcesRequest (same shape): claims = 1, each Claim
// {namespace = 1, uid = 2, name = 3}.
func claimsRequest(namespace, uid, name string) []byte {
	var claim []byte
	claim = appendString(claim, 1, namespace)
	claim = appendString(claim, 2, uid)
	claim = appendString(claim, 3, name)
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(req, claim)
}

// claimsMap decodes the map<string, V> of field 1 of the DRA responses.
func claimsMap(reply []byte) (map[string][]byte, error) {
	top, err := fields(reply)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, entry := range top[1] {
		kv, err := fields(entry.bytes)
		if err != nil {
			return nil, err
		}
		var value []byte
		if len(kv[2]) > 0 {
			value = kv[2][0].bytes
		}
		out[first(kv[1])] = value
	}
	return out, nil
}

func register(ctx context.Context, socket string) string {
	conn, err := dialRegistration(ctx, socket)
	if err != nil {
		fail("dial registration", err)
	}
	defer conn.Close()
	reply, err := invoke(ctx, conn, getInfoTimeout, "/pluginregistration.Registration/GetInfo", nil)
	if err != nil {
		fail("GetInfo", err)
	}
	info, err := fields(reply)
	if err != nil {
		fail("GetInfo", fmt.Errorf("decoding PluginInfo: %w", err))
	}
	endpoint := first(info[3])
	report(map[string]any{
		"step":               "GetInfo",
		"type":               first(info[1]),
		"name":               first(info[2]),
		"endpoint":           endpoint,
		"supported_versions": strings(info[4]),
	})
	// RegistrationStatus{plugin_registered = 1: true}
	status := protowire.AppendTag(nil, 1, protowire.VarintType)
	status = protowire.AppendVarint(status, 1)
	if _, err := invoke(ctx, conn, notifyTimeout, "/pluginregistration.Registration/NotifyRegistrationStatus", status); err != nil {
		fail("NotifyRegistrationStatus", err)
	}
	report(map[string]any{"step": "NotifyRegistrationStatus"})
	return endpoint
}

func prepareAndUnprepare(ctx context.Context, conn *grpc.ClientConn, namespace, uid, name string) {
	const service = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
	reply, err := invoke(ctx, conn, draCallTimeout, service+"NodePrepareResources", claimsRequest(namespace, uid, name))
	if err != nil {
		fail("NodePrepareResources", err)
	}
	claims, err := claimsMap(reply)
	if err != nil {
		fail("NodePrepareResources", fmt.Errorf("decoding the response: %w", err))
	}
	answer, ok := claims[uid]
	if !ok {
		fail("NodePrepareResources", fmt.Errorf("claim %s missing from the response", uid))
	}
	result, err := fields(answer)
	if err != nil {
		fail("NodePrepareResources", fmt.Errorf("decoding the claim's result: %w", err))
	}
	cdiIDs := []string{}
	for _, device := range result[1] {
		d, err := fields(device.bytes)
		if err != nil {
			fail("NodePrepareResources", fmt.Errorf("decoding a device: %w", err))
		}
		cdiIDs = append(cdiIDs, strings(d[4])...)
	}
	report(map[string]any{
		"step":           "NodePrepareResources",
		"devices":        len(result[1]),
		"cdi_device_ids": cdiIDs,
		"claim_error":    first(result[2]),
	})

	reply, err = invoke(ctx, conn, draCallTimeout, service+"NodeUnprepareResources", claimsRequest(namespace, uid, name))
	if err != nil {
		fail("NodeUnprepareResources", err)
	}
	claims, err = claimsMap(reply)
	if err != nil {
		fail("NodeUnprepareResources", fmt.Errorf("decoding the response: %w", err))
	}
	answer, ok = claims[uid]
	if !ok {
		fail("NodeUnprepareResources", fmt.Errorf("claim %s missing from the response", uid))
	}
	result, err = fields(answer)
	if err != nil {
		fail("NodeUnprepareResources", fmt.Errorf("decoding the claim's result: %w", err))
	}
	report(map[string]any{"step": "NodeUnprepareResources", "claim_error": first(result[1])})
}

// watchHealth opens the v1alpha1 health stream, as 1.34-1.36 kubelets do,
// and reads its first message: devices = 1, each DeviceHealth {device = 1
// {pool_name = 1, device_name = 2}, health = 2}.
func watchHealth(ctx context.Context, conn *grpc.ClientConn) {
	const step = "NodeWatchResources"
	ctx, cancel := context.WithTimeout(ctx, draCallTimeout)
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: "NodeWatchResources", ServerStreams: true}
	stream, err := conn.NewStream(ctx, desc, "/v1alpha1.DRAResourceHealth/NodeWatchResources", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		fail(step, err)
	}
	empty := []byte{}
	if err := stream.SendMsg(&empty); err != nil {
		fail(step, err)
	}
	if err := stream.CloseSend(); err != nil {
		fail(step, err)
	}
	var msg []byte
	if err := stream.RecvMsg(&msg); err != nil {
		fail(step, err)
	}
	top, err := fields(msg)
	if err != nil {
		fail(step, fmt.Errorf("decoding the message: %w", err))
	}
	healthy := 0
	for _, device := range top[1] {
		d, err := fields(device.bytes)
		if err != nil {
			fail(step, fmt.Errorf("decoding a device: %w", err))
		}
		if len(d[2]) > 0 && d[2][0].varint == 1 {
			healthy++
		}
	}
	report(map[string]any{"step": step, "devices": len(top[1]), "healthy": healthy})
}

func main() {
	registration := flag.String("registration", "", "the plugin's registration socket")
	namespace := flag.String("claim-namespace", "default", "namespace of the claim to prepare")
	name := flag.String("claim-name", "", "name of the claim to prepare")
	uid := flag.String("claim-uid", "", "uid of the claim to prepare; no DRA calls when empty")
	health := flag.Bool("health", false, "read the first message of the v1alpha1 health stream")
	flag.Parse()
	if *registration == "" {
		fail("flags", errors.New("-registration is required"))
	}
	ctx := context.Background()
	endpoint := register(ctx, *registration)
	if *uid == "" && !*health {
		return
	}
	conn, err := dialDRA(endpoint)
	if err != nil {
		fail("dial DRA endpoint", err)
	}
	defer conn.Close()
	if *uid != "" {
		prepareAndUnprepare(ctx, conn, *namespace, *uid, *name)
	}
	if *health {
		watchHealth(ctx, conn)
	}
}
