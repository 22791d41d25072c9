#!/usr/bin/env bash
# Install edge-agent as a systemd service in one command (docs/guides/RASPBERRY_PI.md).
#
#   sudo scripts/install-agent.sh [--wheel FILE] [--extras ble,i2c,http] [--agent-id ID] [--no-start]
#   sudo scripts/install-agent.sh --uninstall
#
# Installs (or upgrades: run it again with a newer checkout or wheel; it is idempotent):
#   /opt/edge-agent/venv                    the agent and its dependencies (a venv): the
#                                           lean install (no collector), at the versions
#                                           tested (requirements/agent.txt, from uv.lock)
#   /etc/systemd/system/edge-agent.service  the unit, and in edge-agent.service.d/ the
#                                           drop-ins: credentials.conf, ble.conf, i2c.conf
#   /etc/edge-agent/agent.toml              from configs/agent.toml if there is none
#   /etc/edge-agent/credentials/            root-only; every file in it reaches the service
#                                           as /run/credentials/edge-agent.service/secret_<name>
#   /var/cache/edge-agent/numba             the kernels, compiled once here
# and enables and (re)starts the service when systemd runs.  Without a running systemd (a
# chroot, an image being built) it installs and enables without starting.
#
# --uninstall removes all of it except the state directory (budget ledger, sequence numbers,
# spool): a reinstall continues from it, and deleting it is left to you (it says where).
#
# EDGE_AGENT_PREFIX, EDGE_AGENT_ETC, EDGE_AGENT_UNIT_DIR and EDGE_AGENT_CACHE move the paths
# (the tests install into a temporary directory); PYTHON picks the interpreter (python3).
set -euo pipefail

PREFIX=${EDGE_AGENT_PREFIX:-/opt/edge-agent}
ETC=${EDGE_AGENT_ETC:-/etc/edge-agent}
UNIT_DIR=${EDGE_AGENT_UNIT_DIR:-/etc/systemd/system}
CACHE=${EDGE_AGENT_CACHE:-/var/cache/edge-agent}
PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UNIT=edge-agent.service
VENV=$PREFIX/venv
DROPINS=$UNIT_DIR/$UNIT.d
WANTS=$UNIT_DIR/multi-user.target.wants/$UNIT
# An agent id (edge_agent.config.NAME_PATTERN; a test keeps them equal).
NAME_PATTERN='^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'

wheel="" extras="" agent_id="" start=1 uninstall=0

say() { printf 'install-agent: %s\n' "$*"; }
die() { printf 'install-agent: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,25s/^# \{0,1\}//p' "$0"; }

while [ $# -gt 0 ]; do
    case $1 in
        --wheel) [ $# -ge 2 ] || die "--wheel needs a file"; wheel=$2; shift 2 ;;
        --extras) [ $# -ge 2 ] || die "--extras needs a list (ble,i2c,http)"; extras=$2; shift 2 ;;
        --agent-id) [ $# -ge 2 ] || die "--agent-id needs an id"; agent_id=$2; shift 2 ;;
        --no-start) start=0; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

# systemd is the init system here and now (sd_booted()), not just installed.
systemd_running() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

for path in "$PREFIX" "$ETC" "$UNIT_DIR" "$CACHE"; do
    parent=$path
    while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
    [ -w "$parent" ] || die "$parent is not writable: run as root (sudo $0 ...)"
done

# Where the state lives: [privacy] state_dir of agent.toml (read before it is removed).
state_dir() {
    local config=$ETC/agent.toml
    if [ -f "$config" ]; then
        "$PYTHON" - "$config" <<'EOF' 2>/dev/null && return
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(tomllib.load(f).get("privacy", {}).get("state_dir", "/var/lib/edge-agent"))
EOF
    fi
    echo /var/lib/edge-agent
}

uninstall() {
    local state
    state=$(state_dir)
    if systemd_running; then
        systemctl disable --now "$UNIT" 2>/dev/null || true
    fi
    rm -f "$WANTS"
    rm -rf "$UNIT_DIR/$UNIT" "$DROPINS" "$PREFIX" "$ETC" "$CACHE"
    # DynamicUser=yes keeps the cache in /var/cache/private/<name> behind the symlink.
    [ "$CACHE" = /var/cache/edge-agent ] && rm -rf /var/cache/private/edge-agent
    if systemd_running; then systemctl daemon-reload; fi
    say "removed the service, $PREFIX, $ETC (configuration and credentials) and the kernel cache"
    local where=$state
    # DynamicUser=yes: the service's /var/lib/edge-agent is /var/lib/private/edge-agent.
    [ "$state" = /var/lib/edge-agent ] && [ -d /var/lib/private/edge-agent ] \
        && where="$state /var/lib/private/edge-agent"
    say "KEPT the state directory ($where): the budget ledger (every epsilon spent),"
    say "  sequence numbers and unsent reports; a reinstall continues from it.  Deleting it"
    say "  forgets what the wearers have spent, so only for a retired device: sudo rm -rf $where"
}

if [ "$uninstall" = 1 ]; then
    uninstall
    exit 0
fi

# -- checks ------------------------------------------------------------------------------
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "$PYTHON must be Python 3.11 or newer (Debian 12 bookworm, Raspberry Pi OS 12)"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
    || die "$PYTHON has no venv module: sudo apt-get install python3-venv"
case $(uname -m) in
    aarch64|x86_64) ;;
    *) die "$(uname -m) is not supported: numba needs a 64-bit OS (aarch64), see docs/guides/RASPBERRY_PI.md" ;;
esac
if [ -n "$wheel" ]; then
    [ -f "$wheel" ] || die "--wheel: no such file: $wheel"
    source_spec=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
else
    [ -f "$REPO/pyproject.toml" ] || die "no wheel given and $REPO is not a checkout"
    source_spec=$REPO
fi
if [ ! -f "$ETC/agent.toml" ]; then  # it will be written: with this device's id
    id=${agent_id:-$(hostname -s 2>/dev/null || hostname)}
    [[ $id =~ $NAME_PATTERN ]] \
        || die "--agent-id: '$id' is not an agent id (a letter or digit, then letters, digits, . _ -; at most 64)"
fi
for extra in ${extras//,/ }; do
    case $extra in ble|i2c|http) ;; *) die "--extras: unknown extra '$extra' (ble, i2c, http)" ;; esac
done

# -- the venv and the agent ------------------------------------------------------------------
if ! "$VENV/bin/python" -c '' 2>/dev/null; then
    say "creating $VENV"
    rm -rf "$VENV"
    mkdir -p "$PREFIX"
    "$PYTHON" -m venv "$VENV"
fi
spec=$source_spec
[ -n "$extras" ] && spec="$source_spec[$extras]"
say "installing $(basename "$source_spec") into $VENV"
# Dependencies when missing or too old, then this version of the project over whatever
# version was there (the same version number from a newer checkout too).
# At the versions the release was tested with (make lock writes them from uv.lock), when
# the checkout has them.
constraints=()
[ -f "$REPO/requirements/agent.txt" ] && constraints=(--constraint "$REPO/requirements/agent.txt")
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${constraints[@]}" "$spec"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
    --no-deps "$source_spec"
version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("edge-ldp"))')

# -- configuration and credentials ---------------------------------------------------------
install -d -m 0755 "$ETC"
install -d -m 0700 "$ETC/credentials"
if [ ! -f "$ETC/agent.toml" ]; then
    # The sample; its agent_id becomes this device's (see the checks above).
    sed "s/^agent_id = \"[^\"]*\"/agent_id = \"$id\"/" "$REPO/configs/agent.toml" \
        > "$ETC/agent.toml.new"
    chmod 0644 "$ETC/agent.toml.new"
    mv "$ETC/agent.toml.new" "$ETC/agent.toml"
    say "wrote $ETC/agent.toml from the sample (agent_id = \"$id\"): set [broker] and the channels"
elif [ -n "$agent_id" ]; then
    say "kept $ETC/agent.toml (--agent-id is used only when it is written)"
else
    say "kept $ETC/agent.toml"
fi

# -- the unit and its drop-ins --------------------------------------------------------------
install -d -m 0755 "$UNIT_DIR" "$DROPINS"
sed -e "s#/opt/edge-agent/venv#$VENV#g" -e "s#/etc/edge-agent/#$ETC/#g" \
    "$REPO/systemd/$UNIT" > "$UNIT_DIR/$UNIT.new"
chmod 0644 "$UNIT_DIR/$UNIT.new"
mv "$UNIT_DIR/$UNIT.new" "$UNIT_DIR/$UNIT"
cat > "$DROPINS/credentials.conf" <<EOF
# Written by scripts/install-agent.sh.  Every file in $ETC/credentials (root-only)
# reaches the service, and only the service, as
# /run/credentials/$UNIT/secret_<file name>, e.g.
#   [broker] password_file = "/run/credentials/$UNIT/secret_mqtt-password"
[Service]
LoadCredential=secret:$ETC/credentials
EOF
chmod 0644 "$DROPINS/credentials.conf"
for extra in ble i2c; do
    if [[ ,$extras, == *",$extra,"* ]]; then
        install -m 0644 "$REPO/systemd/edge-agent-$extra.conf" "$DROPINS/$extra.conf"
    else
        rm -f "$DROPINS/$extra.conf"  # an extra no longer asked for
    fi
done
# Enabled: wanted by multi-user.target ([Install] of the unit), with or without systemctl.
install -d -m 0755 "$(dirname "$WANTS")"
ln -sfn "$UNIT_DIR/$UNIT" "$WANTS"
if command -v systemd-analyze >/dev/null; then
    # verify checks ExecStart's binary, the directives and the drop-ins.
    if ! problems=$(systemd-analyze verify "$UNIT_DIR/$UNIT" 2>&1 | grep -i "$UNIT" ); then
        say "systemd-analyze verify: the unit is clean"
    else
        say "systemd-analyze verify reports:"; printf '  %s\n' "$problems"
    fi
fi

# -- the configuration is valid? ------------------------------------------------------------
config_ok=1
if ! "$VENV/bin/edge-agent" check-config "$ETC/agent.toml" >/dev/null 2>"$PREFIX/check-config.err"; then
    config_ok=0
    say "$ETC/agent.toml does not pass check-config:"
    sed 's/^/  /' "$PREFIX/check-config.err" >&2
fi
rm -f "$PREFIX/check-config.err"

# -- the kernel cache, and the service -------------------------------------------------------
if systemd_running && [ "$start" = 1 ] && [ "$config_ok" = 1 ]; then
    systemctl daemon-reload
    say "starting $UNIT (its start compiles the kernels it lacks before it says READY)"
    systemctl restart "$UNIT"
    systemctl --no-pager --lines=0 status "$UNIT" | head -3 || true
else
    if [ "$config_ok" = 1 ] && [ ! -L "$CACHE" ]; then
        # Compiled as root before the first start; systemd hands the directory to the
        # service's dynamic user then (moved to /var/cache/private, ownership changed).
        NUMBA_CACHE_DIR=$CACHE/numba "$VENV/bin/edge-agent" --log-level warning warm-up \
            --config "$ETC/agent.toml" | sed 's/^/install-agent: /'
    fi
    if systemd_running; then
        systemctl daemon-reload
        say "installed and enabled, not started (--no-start or the configuration): sudo systemctl start edge-agent"
    else
        say "systemd is not running here (a chroot or an image being built): installed and enabled; it starts at boot"
    fi
fi
say "edge-agent $version installed in $VENV"
[ "$config_ok" = 1 ] || exit 1
