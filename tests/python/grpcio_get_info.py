"""Calls pluginregistration.Registration/GetInfo on a Unix socket with Python
grpcio (gRPC C-core), its default authority for a `unix:` target, and raw
bytes in and out. Prints the PluginInfo as one JSON line; on an RPC error
prints {"error": ...} and exits 1.

Usage: grpcio_get_info.py SOCKET_PATH
"""

import json
import sys

import grpc


def fields(message):
    """Decodes the length-delimited fields of a protobuf message: number -> [bytes]."""
    out = {}
    i = 0

    def varint():
        nonlocal i
        shift = value = 0
        while True:
            byte = message[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(message):
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length = varint()
            out.setdefault(number, []).append(message[i : i + length])
            i += length
        elif wire == 0:
            varint()
        else:
            raise ValueError(f"unexpected wire type {wire} for field {number}")
    return out


def main():
    socket = sys.argv[1]
    with grpc.insecure_channel("unix:" + socket) as channel:
        get_info = channel.unary_unary("/pluginregistration.Registration/GetInfo")
        try:
            reply = get_info(b"", timeout=10)
        except grpc.RpcError as e:
            print(json.dumps({"error": f"{e.code()}: {e.details()}"}))
            sys.exit(1)
    info = fields(reply)
    text = lambda n: [v.decode() for v in info.get(n, [])]
    print(
        json.dumps(
            {
                "type": "".join(text(1)),
                "name": "".join(text(2)),
                "endpoint": "".join(text(3)),
                "supported_versions": text(4),
            }
        )
    )


if __name__ == "__main__":
    main()
