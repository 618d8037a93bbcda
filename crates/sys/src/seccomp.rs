//! Installing a seccomp filter built before a fork (seccompiler builds them; rustix has no
//! seccomp call).

use std::io;

/// One BPF instruction, in the kernel's `struct sock_filter` layout.
pub type Instruction = libc::sock_filter;

/// A compiled seccomp filter: classic BPF instructions, as `seccomp(2)` takes them.
#[derive(Debug, Clone)]
pub struct Filter(Vec<Instruction>);

impl Filter {
    /// A filter from its instructions (`code`, `jt`, `jf`, `k`), in order.
    pub fn new(instructions: impl IntoIterator<Item = (u16, u8, u8, u32)>) -> io::Result<Self> {
        let v: Vec<Instruction> = instructions
            .into_iter()
            .map(|(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
            .collect();
        if v.is_empty() || u16::try_from(v.len()).is_err() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(Filter(v))
    }

    /// How many instructions it has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: [`Filter::new`] refuses an empty filter.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Installs it on the calling thread (no_new_privs must be set). Async-signal-safe.
    pub fn install(&self) -> io::Result<()> {
        let fprog = libc::sock_fprog {
            // Checked in `new`.
            len: self.0.len() as u16,
            filter: self.0.as_ptr().cast_mut(),
        };
        // SAFETY: the kernel copies `len` instructions from `filter`, which points into
        // `self.0`, alive for the whole call, and only reads them.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u32,
                &fprog as *const libc::sock_fprog,
            )
        };
        crate::check(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_filter_is_refused() {
        assert!(Filter::new([]).is_err());
        let f = Filter::new([(0x06, 0, 0, 0x7fff_0000)]).unwrap();
        assert_eq!(f.len(), 1);
    }
}
