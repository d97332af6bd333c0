# opsloop: `docker build -t opsloop .` then
#   docker run -p 3000:3000 -e SLACK_BOT_TOKEN=… -e SLACK_SIGNING_SECRET=… \
#     -e DATABASE_URL=postgresql://user:pass@db/opsloop opsloop
# Without DATABASE_URL the threads live in a SQLite file in /app (mount a volume there to
# keep them). Secrets come from the environment at run time, never from the image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=3000

RUN groupadd --system opsloop \
    && useradd --system --gid opsloop --home-dir /app --shell /usr/sbin/nologin opsloop

# Only what the package needs (no .venv, caches or tests from the build context).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY engine ./engine
COPY localslack ./localslack
COPY tools ./tools
RUN pip install --no-cache-dir . \
    && rm -rf /src

# The working directory holds the default SQLite file and ./docs for search_docs: the
# runbook ships there (mount your own Markdown over it).
WORKDIR /app
COPY docs/*.md ./docs/
RUN chown -R opsloop:opsloop /app
USER opsloop

EXPOSE 3000

HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD python -c "import os,sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '3000'), timeout=3).status == 200 else 1)"

CMD ["opsloop", "serve"]
