# Sourced by the .ci/*-setup.sh scripts that fetch Debian packages without installing them:
# `private_apt DIR SUITE:COMPONENTS...` writes a sources list with one line per SUITE (the
# mirror /etc/apt/sources.list* already uses for Debian, else deb.debian.org, signed by
# Debian's archive keyring) and index/cache directories under DIR, updates the indexes, and
# leaves in APT_OPTS the options that make `apt-get` use them and nothing of the system's apt
# configuration (`apt-get "${APT_OPTS[@]}" download PKG`, then `dpkg -x`).
private_apt() {
    local dir=$1 mirror keyring=/usr/share/keyrings/debian-archive-keyring.gpg entry
    shift
    mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    : >"$dir/sources.list"
    for entry in "$@"; do
        echo "deb [signed-by=$keyring] $mirror ${entry%%:*} ${entry#*:}" >>"$dir/sources.list"
    done
    APT_OPTS=(-q -o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
        -o "APT::Sandbox::User=root")
    apt-get "${APT_OPTS[@]}" update >/dev/null
}
