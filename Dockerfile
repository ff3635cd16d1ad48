# memenv served over OpenEnv (`memenv serve`), as OpenEnv's validator and hub expect: the server on port 8000,
# healthy when GET /health answers 200. Build from the repository root:
#   docker build -t memenv-memqa .                                   # MemQA-v0 (openenv.yaml)
#   docker build -t memenv-memread --build-arg MEMENV_ENV=MemRead-v0 .
#   docker build -t memenv-memqa-tools --build-arg MEMENV_KW="memory_mode=tools objectives=1" .
# or pick at run time: docker run -p 8000:8000 -e MEMENV_ENV=MemDialog-v0 memenv-memqa
FROM python:3.11-slim

ARG MEMENV_ENV=MemQA-v0
ARG MEMENV_KW=""
ENV MEMENV_ENV=${MEMENV_ENV} MEMENV_KW=${MEMENV_KW} PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    MEMENV_CACHE=/home/memenv/.cache/memenv

RUN useradd --create-home memenv
WORKDIR /app
# Only what the package needs (pyproject's packages: memenv, tasks, agents, distill); no torch: serving needs none.
COPY pyproject.toml README.md ./
COPY memenv ./memenv
COPY tasks ./tasks
COPY agents ./agents
COPY distill ./distill
RUN pip install --quiet '.[openenv]'

USER memenv
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
# --kw takes KEY=VALUE words: MEMENV_KW is split on spaces on purpose (sh -c)
CMD ["sh", "-c", "exec memenv serve \"$MEMENV_ENV\" --host 0.0.0.0 --port 8000 ${MEMENV_KW:+--kw $MEMENV_KW}"]
