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
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null 2>&1 || true
# policy-rc.d stops the packages from starting system services in containers.
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null \
  || echo "install-system-deps: apt-get install ${packages[*]} failed" >&2
exit 0
