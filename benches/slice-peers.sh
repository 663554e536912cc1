# Sourced by the benches that measure beside live processes of a slice
# (views-instructions.sh, start-instructions.sh): starts `slice-peers` and stops it again.
# The caller sets `peers_bin` (the slice-peers binary) and `peers_for` (its own name, for the
# error line), and stops the peers on exit (`trap 'stop_peers; ...' EXIT`).

peers_pid=""

# Starts PEERS live processes in the slice SCRATCH (made afresh), each registered through
# libgpuslice.so with a context and 2 MiB, and returns once they all stand ready; they hold
# until stop_peers.
peers_up() { # PEERS SCRATCH
    local fifo="$2.fifo"
    rm -rf "$2" "$fifo"
    mkdir -p "$2"
    mkfifo "$fifo"
    "$peers_bin" --scratch "$2" --peers "$1" <"$fifo" >"$2.out" 2>"$2.err" &
    peers_pid=$!
    exec {hold}>"$fifo"
    until grep -q '^ready' "$2.out" 2>/dev/null; do
        if ! kill -0 "$peers_pid" 2>/dev/null; then
            echo "$peers_for: the peers did not start:" >&2
            cat "$2.err" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# Lets the peers go (their stdin reaches EOF) and waits for them.
stop_peers() {
    if [ -n "$peers_pid" ]; then
        exec {hold}>&-
        wait "$peers_pid" || true
        peers_pid=""
    fi
}
