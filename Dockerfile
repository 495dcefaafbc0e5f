# sagegate: the gateway and the simulated backend in one image (the command picks which).
#   docker build -t sagegate .                      # gateway + simulated backend + semantic predictor
#   docker build --build-arg EXTRAS=tokenize -t sagegate-slim .   # without torch (predictor: global)
FROM python:3.11-slim

ARG EXTRAS=tokenize,embed,onnx
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    SAGEGATE_CACHE=/app/cache

WORKDIR /app
COPY pyproject.toml README.md ./
COPY core ./core
COPY sagegate ./sagegate
COPY gateway ./gateway
COPY predictor ./predictor
COPY policies ./policies
COPY loadgen ./loadgen
COPY sim ./sim
COPY study ./study
RUN pip install ".[${EXTRAS}]" uvloop httptools \
    && useradd --system --uid 10001 sagegate
# The ONNX file the gateway's embedder loads, exported once here from the shipped model (offline).
RUN if pip show onnxruntime >/dev/null 2>&1; then sagegate predictor export-onnx; fi
USER sagegate

EXPOSE 8080
ENTRYPOINT ["sagegate"]
CMD ["serve", "--config", "/etc/sagegate/gateway.yaml"]
