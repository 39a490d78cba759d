#!/bin/sh
# Prints the path of a Python >= 3.12 interpreter, or fails loudly.
# pyenv shims answer "command not found" for versions that are installed but
# not selected, so each candidate is asked for its version before it is used.
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
for c in "${PYTHON:-}" python3.13 python3.12 python3; do
  [ -n "$c" ] || continue
  p=$(command -v "$c" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for p in "$root"/versions/3.13*/bin/python3 "$root"/versions/3.12*/bin/python3 \
         /usr/local/bin/python3.13 /usr/local/bin/python3.12 /usr/bin/python3.13 /usr/bin/python3.12; do
  if [ -x "$p" ] && ok "$p"; then echo "$p"; exit 0; fi
done
echo "find_python: no Python >= 3.12 found; set PYTHON=/path/to/python3.12" >&2
exit 1
