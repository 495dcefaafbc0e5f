# sagegate: the gateway and the simulated backend in one image (the command picks which).
#   docker build -t sagegate .                      # gateway + simulated backend + semantic predictor
#   docker build --build-arg EXTRAS=tokenize -t sagegate-slim .   # without torch (every predictor but semantic)
FROM python:3.11-slim

ARG EXTRAS=tokenize,embed,onnx,trace
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    SAGEGATE_CACHE=/app/cache

WORKDIR /app
COPY pyproject.toml README.md ./
COPY sagegate ./sagegate
COPY deploy/gateway.yaml /etc/sagegate/gateway.yaml
RUN pip install ".[${EXTRAS}]" uvloop httptools \
    && useradd --system --uid 10001 sagegate
# The ONNX files the gateway's embedder loads (int8, with the shipped length tune and without it:
# ``predictor_options.embed_tuned``), exported once here from the shipped model (offline). The cache
# stays the gateway user's, so a start-up export (fp32, ``embed_quantize: false``) can write there too.
RUN if pip show onnxruntime >/dev/null 2>&1; then \
        sagegate predictor export-onnx && sagegate predictor export-onnx --stock; \
    fi \
    && mkdir -p /app/cache && chown -R sagegate /app/cache
USER sagegate

EXPOSE 8080
ENTRYPOINT ["sagegate"]
CMD ["serve", "--config", "/etc/sagegate/gateway.yaml"]
