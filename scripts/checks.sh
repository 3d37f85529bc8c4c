# Sourced by the scripts: numbers they take from the environment or the command line are checked
# before any build or run. A value that is not a whole number in range ends the script at once
# with one line naming it (exit 2), instead of a loop that silently runs zero times, a wrapped
# number or a failure half-way through.

# gg_int NAME VALUE MIN [MAX]: VALUE is a whole number in [MIN, MAX] (MAX default 10^9).
gg_int() {
  local name="$1" value="$2" min="$3" max="${4:-1000000000}"
  if ! [[ $value =~ ^[0-9]{1,10}$ ]] || ((10#$value < min || 10#$value > max)); then
    echo "$(basename "$0"): $name = '$value' must be a whole number in [$min, $max]" >&2
    exit 2
  fi
}

# gg_ints NAME MIN MAX VALUE...: each VALUE as gg_int (a list such as RANKS).
gg_ints() {
  local name="$1" min="$2" max="$3" v
  shift 3
  (($# > 0)) || { echo "$(basename "$0"): $name is empty: give at least one number" >&2; exit 2; }
  for v in "$@"; do gg_int "$name" "$v" "$min" "$max"; done
}

# gg_decimal NAME VALUE MIN: VALUE is a decimal number (digits, at most one point) >= MIN.
gg_decimal() {
  local name="$1" value="$2" min="$3"
  if ! [[ $value =~ ^[0-9]{1,9}(\.[0-9]{1,9})?$ ]] ||
    ! awk -v v="$value" -v m="$min" 'BEGIN { exit !(v + 0 >= m + 0) }'; then
    echo "$(basename "$0"): $name = '$value' must be a decimal number >= $min" >&2
    exit 2
  fi
}

# gg_name NAME VALUE: VALUE is a plain file name (letters, digits, '.', '_', '-'; no '/', not '.'
# or '..'), for a results file the script writes under a folder of its own.
gg_name() {
  local name="$1" value="$2"
  if ! [[ $value =~ ^[A-Za-z0-9._-]{1,100}$ ]] || [[ $value == . || $value == .. ]]; then
    echo "$(basename "$0"): $name = '$value' must be a file name of letters, digits, '.', '_' or '-'" >&2
    exit 2
  fi
}

# gg_refusal TEXT: why a gossipgrad command refused, from its output TEXT: the first line saying
# "error:" without gossipgrad's prefix, else the last line (a crash's).
gg_refusal() {
  { grep -m1 'error:' <<<"$1" || tail -n 1 <<<"$1"; } | sed 's/^gossipgrad: error: //'
}

# gg_torch_check: TORCH (the PyTorch of the baselines) is 2.15 (the default: PyPI's, pinned, in
# bench/torch_env.sh's virtual environment) or debian (Debian's python3-torch 1.13, the anchor of
# the results before 2026-11-29). Checked before anything runs.
gg_torch_check() {
  case ${TORCH:-2.15} in
  2.15 | debian) ;;
  *) echo "$(basename "$0"): TORCH = '$TORCH' must be 2.15 (PyPI, the default) or debian (python3-torch 1.13)" >&2; exit 2 ;;
  esac
}

# gg_torch_python: prints the python that runs TORCH's PyTorch (bench/torch_env.sh makes the 2.15
# environment on first use, about 5 GB); exits 1 with one line when it cannot.
gg_torch_python() {
  gg_torch_check
  local here py
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [[ ${TORCH:-2.15} == debian ]]; then
    py=/usr/bin/python3
    "$py" -c 'import torch' 2>/dev/null ||
      { echo "$(basename "$0"): TORCH=debian: /usr/bin/python3 has no torch (apt-get install python3-torch)" >&2; exit 1; }
  else
    py=$("$here/bench/torch_env.sh") ||
      { echo "$(basename "$0"): bench/torch_env.sh failed (above); TORCH=debian runs Debian's torch 1.13" >&2; exit 1; }
  fi
  echo "$py"
}
