#!/usr/bin/env bash
# Print the path of a Python X.Y interpreter (default 3.10), or say on stderr why there is none.
# Looks at PYTHON_X_Y (e.g. PYTHON_3_10=/path/to/python), pyenv's versions, then pythonX.Y on PATH;
# every candidate is run, so a pyenv shim for a version that is not selected does not count.
set -u
want="${1:-3.10}"
override_var="PYTHON_${want/./_}"
candidates=("${!override_var:-}")
if command -v pyenv >/dev/null 2>&1; then
  root="$(pyenv root 2>/dev/null)"
  for v in $(pyenv versions --bare 2>/dev/null | grep -E "^${want//./\\.}(\.[0-9]+)?$" | sort -rV); do
    candidates+=("$root/versions/$v/bin/python$want")
  done
fi
candidates+=("$(command -v "python$want" 2>/dev/null)")
for py in "${candidates[@]}"; do
  [ -n "$py" ] && [ -x "$py" ] || continue
  if [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
    echo "$py"
    exit 0
  fi
done
echo "find_python.sh: no Python $want interpreter found (tried \$$override_var, pyenv versions, python$want" \
     "on PATH); install one, e.g. 'pyenv install $want', or set $override_var=/path/to/python$want" >&2
exit 1
