"""Generated gRPC stubs (hack/gen-proto.sh). Do not edit."""
