//! A minimal writer of `newc` cpio archives (the initramfs format), for the tools archive the
//! provider appends to the base initramfs: the kernel unpacks concatenated archives in order.
//! Deterministic: fixed inode numbers, owner root, mtime 0.

/// One entry of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory with a mode (permission bits).
    Dir {
        /// Path inside the archive, relative (`tools`).
        path: String,
        /// Permission bits.
        mode: u32,
    },
    /// A regular file.
    File {
        /// Path inside the archive (`tools/plimsoll-agent`).
        path: String,
        /// Permission bits.
        mode: u32,
        /// Contents.
        data: Vec<u8>,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn header(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, size: usize, name: &str) {
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        size as u32,
        0, // devmajor
        0, // devminor
        0, // rdevmajor
        0, // rdevminor
        name.len() as u32 + 1,
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
}

/// Appends the archive of `entries` (and its trailer) to `out`, which must already be padded
/// to 4 bytes (the kernel skips zero bytes between concatenated archives).
pub fn append(out: &mut Vec<u8>, entries: &[Entry]) {
    pad4(out);
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir { path, mode } => header(out, ino, S_IFDIR | mode, 2, 0, path),
            Entry::File { path, mode, data } => {
                header(out, ino, S_IFREG | mode, 1, data.len(), path);
                out.extend_from_slice(data);
                pad4(out);
            }
        }
    }
    header(out, 0, 0, 1, 0, "TRAILER!!!");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout() {
        let mut out = b"abc".to_vec();
        append(
            &mut out,
            &[
                Entry::Dir {
                    path: "tools".into(),
                    mode: 0o755,
                },
                Entry::File {
                    path: "tools/x".into(),
                    mode: 0o755,
                    data: b"hello".to_vec(),
                },
            ],
        );
        // Padded to 4 before the first header.
        assert_eq!(&out[..4], b"abc\0");
        assert_eq!(&out[4..10], b"070701");
        // mode of the directory: 040755
        assert_eq!(&out[4 + 14..4 + 22], b"000041ed");
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("tools/x\0"));
        assert!(text.contains("hello"));
        // 110-byte header + "TRAILER!!!\0" = 121 bytes, padded to 124.
        assert!(out.ends_with(b"TRAILER!!!\0\0\0\0"));
        assert_eq!(out.len() % 4, 0);
    }

    /// The host's cpio(1) reads what we write, when it is installed.
    #[test]
    fn cpio_reads_it() {
        let Ok(cpio) = which("cpio") else {
            eprintln!("SKIP cpio_reads_it: no cpio(1) on this host");
            return;
        };
        let mut out = Vec::new();
        append(
            &mut out,
            &[
                Entry::Dir {
                    path: "d".into(),
                    mode: 0o755,
                },
                Entry::File {
                    path: "d/f".into(),
                    mode: 0o644,
                    data: b"content\n".to_vec(),
                },
            ],
        );
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("a.cpio");
        std::fs::write(&archive, &out).unwrap();
        let mut r = plimsoll_sandbox::Spawn::new(&cpio, tmp.path())
            .args(["-t", "-F"])
            .arg(&archive)
            .spawn()
            .unwrap();
        let mut listing = String::new();
        std::io::Read::read_to_string(&mut r.stdout, &mut listing).unwrap();
        assert!(r.child.wait().unwrap().success());
        assert_eq!(listing, "d\nd/f\n");
    }

    fn which(name: &str) -> Result<std::path::PathBuf, ()> {
        ["/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(name))
            .find(|p| p.exists())
            .ok_or(())
    }
}
