//! Whether an image is in use on this host: a process whose root is the image's root file
//! system (a container of crun or runc, runsc's gofer), or one holding its VM disk open
//! (QEMU). Compared by device and inode, so a bind mount or a path reached another way is
//! the same file.

use std::fs;
use std::os::unix::fs::MetadataExt as _;

use crate::store::StoredImage;

/// The processes using `image` now: pids, sorted. Processes that vanish or cannot be read
/// while they are looked at are left out.
pub fn processes_using(image: &StoredImage) -> Vec<i32> {
    let key = |m: fs::Metadata| (m.dev(), m.ino());
    let Ok(root) = fs::metadata(image.at.rootfs()).map(key) else {
        return Vec::new();
    };
    let disk = image
        .disk
        .as_ref()
        .and_then(|d| fs::metadata(d).ok())
        .map(key);
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let proc = format!("/proc/{pid}");
            if fs::metadata(format!("{proc}/root")).map(key).ok() == Some(root) {
                return true;
            }
            let Some(disk) = disk else { return false };
            fs::read_dir(format!("{proc}/fd")).is_ok_and(|fds| {
                fds.filter_map(Result::ok)
                    .any(|fd| fs::metadata(fd.path()).map(key).ok() == Some(disk))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ImageStore;

    #[test]
    fn a_process_holding_the_disk_open_uses_the_image() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        let id = format!("sha256:{}", "ab".repeat(32));
        fs::write(dir.join("identity"), &id).unwrap();
        fs::write(dir.join("disk.ext4"), "").unwrap();
        fs::write(dir.join("disk.identity"), &id).unwrap();
        let store = ImageStore::new(tmp.path().into(), "data".into());
        let image = store.read("data").unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(!processes_using(&image).contains(&me));
        let held = fs::File::open(dir.join("disk.ext4")).unwrap();
        assert!(processes_using(&image).contains(&me));
        drop(held);
        assert!(!processes_using(&image).contains(&me));
    }
}
