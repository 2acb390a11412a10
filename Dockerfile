# vramplan's web page and JSON API (docs/web.md).  No torch: the analytic engine needs none.
#   docker build -t vramplan-web . && docker run --rm -p 8000:8000 vramplan-web
#
# Two stages: the first has a C compiler and builds the wheel with the allocator's C replay
# (setup.py, vramplan.alloc._replay: about six times faster than the Python reference it mirrors, which
# keeps an estimate under the 50 ms the page is built for: benchmarks/bench_web.txt); the second
# installs that wheel on a slim image without the compiler.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# the extension is optional in setup.py; here its absence is an error, not a slower image
RUN pip wheel --no-cache-dir --no-deps -w /wheels . \
 && python -c "import glob, zipfile; w, = glob.glob('/wheels/vramplan-*.whl'); \
assert any(n.endswith('.so') for n in zipfile.ZipFile(w).namelist()), 'the C replay was not built'"

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/vramplan-*.whl)[web]" && rm -rf /wheels \
 && useradd --system --no-create-home vramplan
USER vramplan
# no request reads the Hub unless VRAMPLAN_WEB_ALLOW_HUB=1; then its files are cached in HF_HOME, inside the
# container (the user has no home directory), and lost with it
ENV VRAMPLAN_WEB_MAX_BODY_BYTES=1048576 VRAMPLAN_WEB_TIME_LIMIT_S=20 HF_HOME=/tmp/huggingface
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["vramplan", "web", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
