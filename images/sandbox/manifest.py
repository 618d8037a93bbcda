#!/usr/bin/env python3
"""images/sandbox/manifest.py: write the manifest of an image root filesystem.

Usage: manifest.py ROOTFS [--header LINE ...] > manifest

Format (plimsoll-image-manifest/v1), UTF-8/ASCII text, '\n' line ends:
  * first, header lines starting with '# ' (format name, then what --header gave);
  * then one line per entry of the tree, the root itself included as '/',
    sorted bytewise (C locale) by the entry's raw path bytes:
      dir <mode> <uid>:<gid> <path>
      file <mode> <uid>:<gid> <size> sha256:<hex> <path>
      symlink <uid>:<gid> <target> <path>
    <mode> is the permission bits (st_mode & 07777) as 4 octal digits,
    <size> is in bytes (decimal), <hex> is the lowercase SHA-256 of the contents,
    <path> is absolute inside the image ('/usr/bin/env'), <target> is the link
    text as stored (not resolved). Hard links are listed once per path, as files.
  * <path> and <target> are escaped: bytes 0x21..0x7e other than '\\' stand for
    themselves; every other byte (space, controls, '\\', non-ASCII) is written
    as '\\xHH' (two lowercase hex digits). So no field contains a space.
Not recorded: timestamps, inode numbers. The tree must hold only directories,
regular files and symlinks, with no extended attributes: anything else (device
node, fifo, socket, xattr such as a file capability) is an error.
"""
import hashlib
import os
import stat
import sys


def esc(b: bytes) -> str:
    out = []
    for c in b:
        if 0x21 <= c <= 0x7E and c != 0x5C:
            out.append(chr(c))
        else:
            out.append("\\x%02x" % c)
    return "".join(out)


def sha256_file(p: bytes) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def walk(root: bytes):
    """Yield (relative path bytes starting with b'/', absolute path bytes)."""
    yield b"/", root
    stack = [b""]
    while stack:
        rel = stack.pop()
        absdir = root + rel
        with os.scandir(absdir) as it:
            for e in it:
                r = rel + b"/" + e.name
                yield r, root + r
                if e.is_dir(follow_symlinks=False):
                    stack.append(r)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.fsencode(os.path.abspath(argv[1])).rstrip(b"/")
    headers = ["plimsoll-image-manifest/v1"]
    i = 2
    while i < len(argv):
        if argv[i] == "--header" and i + 1 < len(argv):
            h = argv[i + 1]
            if "\n" in h:
                raise SystemExit("manifest.py: header with a newline")
            headers.append(h)
            i += 2
        else:
            raise SystemExit("manifest.py: unknown argument %r" % argv[i])

    entries = sorted(walk(root), key=lambda t: t[0])
    errors = []
    out = ["# " + h for h in headers]
    for rel, ab in entries:
        st = os.lstat(ab)
        owner = "%d:%d" % (st.st_uid, st.st_gid)
        mode = "%04o" % stat.S_IMODE(st.st_mode)
        try:
            xattrs = os.listxattr(ab, follow_symlinks=False)
        except OSError:
            xattrs = []
        if xattrs:
            errors.append("%s: extended attributes %s" % (esc(rel), ",".join(xattrs)))
        if stat.S_ISDIR(st.st_mode):
            out.append("dir %s %s %s" % (mode, owner, esc(rel)))
        elif stat.S_ISREG(st.st_mode):
            out.append("file %s %s %d sha256:%s %s" % (mode, owner, st.st_size, sha256_file(ab), esc(rel)))
        elif stat.S_ISLNK(st.st_mode):
            out.append("symlink %s %s %s" % (owner, esc(os.readlink(ab)), esc(rel)))
        else:
            errors.append("%s: not a file, directory or symlink (mode %o)" % (esc(rel), st.st_mode))
    if errors:
        for e in errors:
            print("manifest.py: error: " + e, file=sys.stderr)
        return 1
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
