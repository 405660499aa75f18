# Which Python the launchers run: one lookup, sourced by every launcher (examples/scripts/*.sh, benchmarks/*.sh).
#
#   source "$ROOT/scripts/python_env.sh"
#   hacpo_python [--var NAME]... [--no-install] [MODULE...] || exit
#
# sets PY to the first of
#   1. an explicit choice: HACPO_PYTHON (a python executable), a launcher's own variable named with --var (e.g. the
#      PYTHON of benchmarks/gpu_check.sh), or HACPO_VENV (a virtual environment folder: $HACPO_VENV/bin/python).
#      It is used as given; one that does not exist or is not executable is an error naming the variable and path;
#   2. the active environment: $VIRTUAL_ENV/bin/python, $CONDA_PREFIX/bin/python, then python3 on PATH, the first
#      whose Python finds every MODULE (default: openrlhf_hacpo torch transformers deepspeed ray), as on a cluster
#      where the project is pip-installed into one's own environment;
#   3. the repository's .venv, set up on first use (and refreshed after a change of setup.py) by
#      bash scripts/install.sh; --no-install takes it only when it exists.
# and prints one line, "[python] using /path/to/python (reason)", to stderr.
#
# HACPO_LOOKUP_ONLY=1: print the chosen python on stdout and exit 0 (the launcher runs nothing else).

HACPO_DEFAULT_MODULES=(openrlhf_hacpo torch transformers deepspeed ray)

# _hacpo_missing PYTHON MODULE...: print the modules PYTHON does not find (importlib.util.find_spec: nothing is
# imported), from a neutral folder and without PYTHONPATH, so a source checkout does not count as an install.
# Fails when PYTHON does not run.
_hacpo_missing() {
    local python=$1
    shift
    (cd / && env -u PYTHONPATH "$python" -c '
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@") 2>/dev/null
}

# _hacpo_explicit NAME VALUE: the python an explicit variable names (a command name is looked up on PATH)
_hacpo_explicit() {
    local name=$1 value=$2 path
    if [[ "$name" == HACPO_VENV ]]; then
        path="$value/bin/python"
        if [[ ! -x "$path" || -d "$path" ]]; then
            echo "[python] HACPO_VENV=$value: $path is not an executable python; set that environment up with" \
                 "HACPO_VENV=$value bash scripts/install.sh, or unset HACPO_VENV" >&2
            return 1
        fi
    else
        path=$(command -v -- "$value" 2>/dev/null || true)
        if [[ -z "$path" || ! -x "$path" || -d "$path" ]]; then
            echo "[python] $name=$value: not an executable python (no such file, or not executable); set $name to" \
                 "a python executable, or unset it" >&2
            return 1
        fi
    fi
    printf '%s\n' "$path"
}

hacpo_python() {
    local vars=(HACPO_PYTHON) install=1 modules=() root
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --var) vars+=("$2"); shift 2 ;;
            --no-install) install=0; shift ;;
            *) modules+=("$1"); shift ;;
        esac
    done
    [[ ${#modules[@]} -gt 0 ]] || modules=("${HACPO_DEFAULT_MODULES[@]}")
    vars+=(HACPO_VENV)
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

    local reason="" name candidate missing why=""
    PY=""
    # 1. an explicit choice
    for name in "${vars[@]}"; do
        [[ -n "${!name:-}" ]] || continue
        PY=$(_hacpo_explicit "$name" "${!name}") || return 1
        reason="$name"
        break
    done
    # 2. the active environment
    if [[ -z "$PY" ]]; then
        local -a candidates=()
        [[ -n "${VIRTUAL_ENV:-}" ]] && candidates+=("VIRTUAL_ENV|$VIRTUAL_ENV/bin/python")
        [[ -n "${CONDA_PREFIX:-}" ]] && candidates+=("CONDA_PREFIX|$CONDA_PREFIX/bin/python")
        candidate=$(command -v python3 2>/dev/null || true)
        [[ -n "$candidate" ]] && candidates+=("python3 on PATH|$candidate")
        for candidate in "${candidates[@]}"; do
            name=${candidate%%|*}
            candidate=${candidate#*|}
            [[ -x "$candidate" ]] || continue
            if missing=$(_hacpo_missing "$candidate" "${modules[@]}") && [[ -z "$missing" ]]; then
                PY=$candidate
                reason="$name: it has ${modules[*]}"
                break
            fi
            why="${why:+$why; }$name lacks ${missing:-a working python}"
        done
    fi
    # 3. the repository's .venv
    if [[ -z "$PY" ]]; then
        local venv="$root/.venv"
        if [[ "$install" == 1 ]]; then
            if ! env -u HACPO_VENV bash "$root/scripts/install.sh" >&2; then
                echo "[python] bash scripts/install.sh could not set up $venv; set HACPO_PYTHON to a python that" \
                     "has ${modules[*]}" >&2
                return 1
            fi
        elif [[ ! -x "$venv/bin/python" ]]; then
            echo "[python] no python has ${modules[*]}${why:+ ($why)} and $venv does not exist; set" \
                 "HACPO_PYTHON to one that has them" >&2
            return 1
        fi
        PY="$venv/bin/python"
        reason="the repository's .venv${why:+; $why}"
    fi
    echo "[python] using $PY ($reason)" >&2
    if [[ "${HACPO_LOOKUP_ONLY:-0}" == 1 ]]; then
        printf '%s\n' "$PY"
        exit 0
    fi
}
