# One image for every Fleetscope process: api, worker, beat and dashboard differ only in their command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    FLEETSCOPE_DATA_DIR=/var/lib/fleetscope

RUN useradd --system --create-home --home-dir /home/fleetscope fleetscope \
 && mkdir -p /var/lib/fleetscope && chown fleetscope /var/lib/fleetscope

WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleetscope ./fleetscope
COPY ingest ./ingest
COPY analyzers ./analyzers
COPY governance ./governance
COPY dashboard ./dashboard
COPY migrations ./migrations
# gcc for ingest/_lines.c (the agents' push loop in C), removed in the same layer; the import proves it was built
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install . \
 && python -c "import ingest._lines" \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

USER fleetscope
EXPOSE 8000 8501
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"
CMD ["fleetscope", "serve", "--host", "0.0.0.0", "--port", "8000"]
