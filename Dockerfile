# vramplan's web page and JSON API (docs/web.md).  No torch: the analytic engine needs none.
#   docker build -t vramplan-web . && docker run --rm -p 8000:8000 vramplan-web
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# the C allocator replay is built when a compiler is present; without one the Python replay is used
RUN pip install --no-cache-dir '.[web]' && useradd --system --no-create-home vramplan
USER vramplan
ENV VRAMPLAN_WEB_MAX_BODY_BYTES=1048576 VRAMPLAN_WEB_TIME_LIMIT_S=20
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["vramplan", "web", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
