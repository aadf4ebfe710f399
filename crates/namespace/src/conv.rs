//! The narrowing of system call results, in one place, so that
//! `clippy::cast_possible_truncation` can stay on: `libc::syscall` returns a `c_long` (and
//! `write` an `isize`), while what the calls made here return (-1, 0, a new descriptor, a
//! byte count of one) fits a `c_int`. A value that did not would be a kernel bug; it is
//! reported as the failure it would be.

use std::io;
use std::os::fd::RawFd;

/// A system call's result as the `c_int` libc's own wrappers return: a value that does not
/// fit becomes -1 with errno `EOVERFLOW`, so the usual `< 0` check reports it. Allocates
/// nothing, for the children between `vfork` and `exec`.
pub(crate) fn c_int<T: TryInto<libc::c_int>>(ret: T) -> libc::c_int {
    ret.try_into().unwrap_or_else(|_| {
        nix::errno::Errno::EOVERFLOW.set();
        -1
    })
}

/// The descriptor a raw `syscall(2)` returned, or its error: errno's for a negative result
/// (so call this straight after the system call), `EOVERFLOW` for one no descriptor has.
pub(crate) fn fd(ret: libc::c_long) -> io::Result<RawFd> {
    match c_int(ret) {
        fd if fd < 0 => Err(io::Error::last_os_error()),
        fd => Ok(fd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_that_do_not_fit_are_failures() {
        assert_eq!(c_int(7_i64), 7);
        assert_eq!(c_int(-1_isize), -1);
        assert_eq!(c_int(i64::from(i32::MAX) + 1), -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EOVERFLOW)
        );
        assert_eq!(fd(3).unwrap(), 3);
        assert_eq!(
            fd(1 << 40).unwrap_err().raw_os_error(),
            Some(libc::EOVERFLOW)
        );
    }
}
