#!/bin/busybox sh
# Give the scratch image its applets (sh, nc, sleep, ...) then run the command.
/bin/busybox mkdir -p /toy/bin /tmp
/bin/busybox --install -s /toy/bin 2>/dev/null
export PATH=/toy/bin:/bin
exec "$@"
