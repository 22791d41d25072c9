#!/usr/bin/env bash
# Install the Debian packages the test suite drives for real, when they are
# missing and apt is usable (root, or passwordless sudo).  Never fails the
# build by itself: tests that need a missing program say so.
set -u
packages=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || packages+=(mosquitto)
command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
# The dashboard is tested in a real headless Chromium (driven by playwright).
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || packages+=(chromium)
# The results store's PostgreSQL engine is tested against a server each test starts.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || packages+=(postgresql)
for extra in "$@"; do packages+=("$extra"); done
[ ${#packages[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"
else
  echo "install-system-deps: cannot install ${packages[*]} (not root, no passwordless sudo)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: no apt-get; please install ${packages[*]} yourself" >&2
  exit 0
fi
echo "install-system-deps: installing ${packages[*]}"

# Debian's maintainer scripts ask /usr/sbin/policy-rc.d whether they may start
# services, and exit status 101 means no: without it, installing mosquitto
# starts and enables the system broker on port 1883 (the tests start their
# own).  Written only when there is none (container images often ship one,
# which is then left alone) and removed again on exit, so the host ends up
# as it was.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ] && [ ! -L "$policy" ]; then
  # Anything at $policy from here on is ours: remove it however we exit.
  trap '$sudo rm -f "$policy"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM HUP
  printf '#!/bin/sh\n# Temporary, from edge-ldp scripts/install-system-deps.sh: no service starts.\nexit 101\n' \
    | $sudo tee "$policy" >/dev/null && $sudo chmod 0755 "$policy" \
    || echo "install-system-deps: cannot write $policy; apt may start the system's mosquitto" >&2
fi

# sudo's env_reset drops an exported DEBIAN_FRONTEND: pass it through env.
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${packages[@]}" >/dev/null \
  || echo "install-system-deps: apt-get install ${packages[*]} failed" >&2
exit 0
