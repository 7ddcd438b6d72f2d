"""Asks a rate limit service ShouldRateLimit once, with stubs built by envoy_stubs.py from
Envoy's own protos; prints the overall code, then per descriptor its code, limit_remaining and
current_limit.requests_per_unit (-1 without a limit).

usage: rls_client.py STUBS_DIR ADDRESS DOMAIN DESCRIPTOR...
DESCRIPTOR is key=value[,key=value...], optionally prefixed with hits:N: (its hits_addend) or
neg:N: (negative hits of N).
"""

import sys


def main(stubs, address, domain, descriptors):
    sys.path.insert(0, stubs)
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    request = rls_pb2.RateLimitRequest(domain=domain)
    for text in descriptors:
        descriptor = request.descriptors.add()
        for prefix in ("hits:", "neg:"):
            if text.startswith(prefix):
                number, text = text[len(prefix):].split(":", 1)
                descriptor.hits_addend.value = int(number)
                descriptor.is_negative_hits = prefix == "neg:"
        for pair in text.split(","):
            key, _, value = pair.partition("=")
            descriptor.entries.append(ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value))
    with grpc.insecure_channel(address) as channel:
        response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)
    codes = rls_pb2.RateLimitResponse.Code
    print(codes.Name(response.overall_code))
    for status in response.statuses:
        limit = status.current_limit.requests_per_unit if status.HasField("current_limit") else -1
        print(codes.Name(status.code), status.limit_remaining, limit)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
