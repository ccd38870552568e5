//! The protocol's stdin and stdout, read and written through tokio's reactor where it can.
//!
//! tokio's own `stdin()` and `fs::File` do every read and write on a blocking thread: each
//! message is a hand-over to that thread and back, which cost more CPU than the rest of a
//! `tools/call`. A pipe or a socket (what the runtime gives a child) can be watched by epoll
//! instead: it is set non-blocking and read and written on the runtime's own threads. Anything
//! else keeps tokio's thread-backed types: a regular file (epoll refuses it), a terminal (its
//! open file is shared with the shell, which would be left non-blocking) and a stdout that is
//! the same pipe as stderr (the log's blocking writes would start failing when it is full).

use std::{
    fs::File,
    io::{self, Read, Write},
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, unix::AsyncFd};
use tokio_util::either::Either;

/// What the protocol is read from: a [`Polled`] pipe or socket, else tokio's stdin.
pub(crate) type Input = Either<Polled, tokio::io::Stdin>;
/// What the protocol is written to: a [`Polled`] pipe or socket, else the descriptor as a tokio file.
pub(crate) type Output = Either<Polled, tokio::fs::File>;

/// stdin for the protocol. Must be called inside a tokio runtime.
pub(crate) fn input() -> Input {
    let stdin = io::stdin();
    let fd = stdin.as_fd();
    if pollable(fd) {
        match Polled::new(fd, Interest::READABLE) {
            Ok(polled) => return Either::Left(polled),
            Err(e) => tracing::debug!("stdin read on tokio's blocking threads: {e}"),
        }
    }
    Either::Right(tokio::io::stdin())
}

/// `protocol`, the descriptor stdout was before fd 1 was pointed at stderr, for the protocol.
/// Must be called inside a tokio runtime.
pub(crate) fn output(protocol: OwnedFd) -> Output {
    let fd = protocol.as_fd();
    if pollable(fd) && !same_file(fd, io::stderr().as_fd()) {
        match Polled::new(fd, Interest::WRITABLE) {
            Ok(polled) => return Either::Left(polled), // holds its own duplicate of `protocol`
            Err(e) => tracing::debug!("stdout written on tokio's blocking threads: {e}"),
        }
    }
    Either::Right(tokio::fs::File::from_std(File::from(protocol)))
}

/// Whether epoll may watch `fd` without side effects on others: a pipe or a socket. (A
/// descriptor fstat fails on is left to the thread-backed types, which report it when used.)
fn pollable(fd: BorrowedFd<'_>) -> bool {
    let mode = fstat(fd).map_or(0, |stat| stat.st_mode & libc::S_IFMT);
    mode == libc::S_IFIFO || mode == libc::S_IFSOCK
}

fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (fstat(a), fstat(b)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: fstat writes a whole `stat` into the zeroed one it is given; `fd` is open for the call.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// Sets or clears O_NONBLOCK on the open file `fd` refers to; returns whether it was set before.
fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<bool> {
    // SAFETY: F_GETFL/F_SETFL only read and change the open file's status flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let wanted = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if wanted != flags && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, wanted) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// A non-blocking pipe or socket registered with tokio's reactor: read and written in place.
pub(crate) struct Polled {
    fd: AsyncFd<File>,
}

impl Polled {
    /// A duplicate of `fd` (sharing its open file, so its non-blocking flag) registered for
    /// `interest`. On failure the open file is left as it was and the duplicate closed.
    pub(crate) fn new(fd: BorrowedFd<'_>, interest: Interest) -> io::Result<Self> {
        let duplicate = File::from(fd.try_clone_to_owned()?);
        let was = set_nonblocking(fd, true)?;
        // SAFETY: the AsyncFd owns `duplicate`, so its descriptor stays open and names the same
        // open file until the AsyncFd is dropped.
        match unsafe { AsyncFd::register_with_interest(duplicate, interest) } {
            Ok(fd) => Ok(Self { fd }),
            Err(e) => {
                let _ = set_nonblocking(fd, was);
                Err(e.into_parts().1)
            }
        }
    }
}

impl AsyncRead for Polled {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready.try_io(|fd| fd.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue, // readiness cleared; poll again to wait
            }
        }
    }
}

impl AsyncWrite for Polled {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut ready = ready!(self.fd.poll_write_ready(cx))?;
            match ready.try_io(|fd| fd.get_ref().write(data)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(written) => return Poll::Ready(written),
                Err(_would_block) => continue,
            }
        }
    }

    // Written straight to the descriptor: nothing is held back to flush.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two new descriptors, owned from here on.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        use std::os::fd::FromRawFd;
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn nonblocking(fd: BorrowedFd<'_>) -> bool {
        let was = set_nonblocking(fd, true).unwrap();
        set_nonblocking(fd, was).unwrap();
        was
    }

    #[tokio::test]
    async fn a_pipe_is_polled_both_ways_and_reads_to_its_end() {
        let (read, write) = pipe();
        assert!(pollable(read.as_fd()) && pollable(write.as_fd()));
        let mut reader = Polled::new(read.as_fd(), Interest::READABLE).unwrap();
        let mut writer = Polled::new(write.as_fd(), Interest::WRITABLE).unwrap();
        drop((read, write)); // the Polled hold their own duplicates
        assert!(nonblocking(reader.fd.get_ref().as_fd()));
        // More than a pipe holds (64 KiB), so the writer waits on the reactor for room.
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let sending = sent.clone();
        let writing = tokio::spawn(async move {
            writer.write_all(&sending).await.unwrap();
            writer.flush().await.unwrap();
        });
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap(); // ends when the writer is dropped: EOF
        writing.await.unwrap();
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn a_socket_is_pollable() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(pollable(a.as_fd()));
    }

    #[tokio::test]
    async fn a_regular_file_is_not_polled_and_is_left_blocking() {
        let path = std::env::temp_dir().join(format!("mesh-sdk-stdio-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!pollable(file.as_fd()));
        // Even asked directly, epoll refuses a regular file, and the file is left blocking.
        assert!(Polled::new(file.as_fd(), Interest::WRITABLE).is_err());
        assert!(!nonblocking(file.as_fd()));
        // output() on it is the thread-backed file, which still writes.
        let Either::Right(mut file) = output(file.into()) else {
            panic!("a regular file was polled");
        };
        file.write_all(b"still written\n").await.unwrap();
        file.flush().await.unwrap();
    }

    #[tokio::test]
    async fn same_file_tells_a_duplicate_from_another_pipe() {
        let (_read, write) = pipe();
        let twin = write.try_clone().unwrap();
        assert!(same_file(write.as_fd(), twin.as_fd()));
        let (_other_read, other) = pipe();
        assert!(!same_file(write.as_fd(), other.as_fd()));
    }
}
