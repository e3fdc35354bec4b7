#!/usr/bin/env bash
# Build a small Debian VM image for the reboot test: systemd, sshd, a data NIC, and
# hkgpu-tune in /opt/hkgpu-tune. Everything from Debian's packages and PyPI wheels.
#   tests/vm/build.sh OUTDIR      -> OUTDIR/{disk.img,vmlinuz,initrd.img,id_ed25519}
set -euo pipefail
OUT=$(realpath -m "${1:?usage: build.sh OUTDIR}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
[ -s "$OUT/disk.img" ] && [ -s "$OUT/vmlinuz" ] && { echo "vm image exists in $OUT"; exit 0; }
ROOT="$OUT/rootfs"
rm -rf "$ROOT"

# the mirror this host already uses
MIRROR=$(sed -n 's/^URIs: *\([^ ]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)

debootstrap --variant=minbase \
  --include=systemd-sysv,udev,dbus,openssh-server,python3,python3-venv,ethtool,iproute2,kmod,iputils-ping,linux-image-cloud-amd64,initramfs-tools \
  bookworm "$ROOT" "$MIRROR" >"$OUT/debootstrap.log" 2>&1

# hkgpu-tune and its runtime deps as wheels, installed into a venv inside the image
W="$ROOT/tmp/wheels"; mkdir -p "$W"
python3 -m pip wheel -q --no-deps -w "$W" "$REPO"
python3 -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$W" pyroute2 pyyaml rich psutil nvidia-ml-py
chroot "$ROOT" python3 -m venv /opt/hkgpu-tune
chroot "$ROOT" /opt/hkgpu-tune/bin/pip install -q --no-index --find-links /tmp/wheels hkgpu-tune
ln -sf /opt/hkgpu-tune/bin/hkgpu-tune "$ROOT/usr/local/bin/hkgpu-tune"
rm -rf "$W"

# system: hostname, fstab, network (eth0 for SSH; eth1 is the data NIC, owned by networkd)
echo hkvm >"$ROOT/etc/hostname"
echo "/dev/vda / ext4 rw,relatime 0 1" >"$ROOT/etc/fstab"
mkdir -p "$ROOT/etc/systemd/network"
printf '[Match]\nName=eth0\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n' >"$ROOT/etc/systemd/network/10-eth0.network"
printf '[Match]\nName=eth1\n[Network]\nAddress=198.18.200.1/24\nLinkLocalAddressing=no\n' >"$ROOT/etc/systemd/network/20-data.network"
chroot "$ROOT" systemctl enable systemd-networkd ssh >/dev/null 2>&1
rm -f "$ROOT"/etc/ssh/ssh_host_*
chroot "$ROOT" ssh-keygen -A >/dev/null
rm -f "$OUT/id_ed25519" "$OUT/id_ed25519.pub"
ssh-keygen -q -t ed25519 -N '' -f "$OUT/id_ed25519"
install -d -m 700 "$ROOT/root/.ssh"
install -m 600 "$OUT/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"

cp "$(ls "$ROOT"/boot/vmlinuz-* | head -1)" "$OUT/vmlinuz"
cp "$(ls "$ROOT"/boot/initrd.img-* | head -1)" "$OUT/initrd.img"
rm -f "$OUT/disk.img"
mkfs.ext4 -q -F -L root -d "$ROOT" "$OUT/disk.img" 3G
rm -rf "$ROOT"
echo "vm image built in $OUT"
