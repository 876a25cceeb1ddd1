#!/usr/bin/env bash
# The Debian packages this project needs, declared once, per use:
#   serve  make serve                    Java 17 for TorchServe's frontend
#   test   make test (and make bench)    + wrk, g++ (AOTInductor), Prometheus with promtool, nginx with njs, the JDK's jlink,
#                                          perf (make bench's waits for a core, scripts/bench/core_waits.py)
#   ci     .ci/run                       + podman, runc, mmdebstrap (make image-test)
# Missing ones are installed when this runs as root with apt-get (a fresh Debian machine); otherwise it stops
# at once, printing the one command that installs them.
#   ./system-packages.sh serve|test|ci
set -euo pipefail
use="${1:?usage: $0 serve|test|ci}"
missing=()
need() {  # need <package...> -- <check command>: the packages when the check fails
    local packages=()
    while [ "$1" != "--" ]; do packages+=("$1"); shift; done
    shift
    "$@" >/dev/null 2>&1 || missing+=("${packages[@]}")
}
has() { for tool in "$@"; do command -v "$tool" || return 1; done; }
need openjdk-17-jre-headless -- bash -c 'java -version 2>&1 | grep -q "version \"17"'
if [ "$use" = test ] || [ "$use" = ci ]; then
    need wrk -- has wrk
    # jlink, jdeps and the jmods: the GPU serving bundle's Java runtime (make gpu-serving-bundle, its test)
    need openjdk-17-jdk-headless -- has jlink jdeps
    need g++ -- has g++
    need linux-perf -- has perf
    need prometheus -- has prometheus promtool
    # nginx with its njs module: the Kubernetes pod's token gateway (deploy/k8s/gateway/) in tests/integration/deploy
    need nginx-light libnginx-mod-http-js -- bash -c 'command -v nginx && test -e /usr/lib/nginx/modules/ngx_http_js_module.so'
fi
if [ "$use" = ci ]; then
    # podman with runc (crun refuses this machine's cgroups) and mmdebstrap build and run the image (make image-test)
    need podman -- has podman
    need runc -- has runc
    need mmdebstrap -- has mmdebstrap
fi
[ ${#missing[@]} -eq 0 ] && exit 0
command="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing the Debian packages 'make $use' needs: ${missing[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    exit 0
fi
echo "missing Debian packages for '$use': ${missing[*]}; install them as root with:" >&2
echo "  $command" >&2
exit 2
