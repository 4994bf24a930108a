//! A server's kill switch: every accepted connection is wrapped so that, once the switch
//! fires, its next read or write fails and the connection closes at once — what clients
//! see when the server's process dies, without the drain [`crate::Running::stop`] gives.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Fires once; every connection wrapped with it fails from then on.
#[derive(Clone, Default)]
pub(crate) struct Kill {
    fired: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Kill {
    /// Fails every connection (those waiting for I/O are woken).
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// `io`, failing once this fires.
    pub(crate) fn wrap(&self, io: TcpStream) -> KillableIo {
        KillableIo {
            io,
            fired: Arc::clone(&self.fired),
            notified: Box::pin(Arc::clone(&self.notify).notified_owned()),
        }
    }
}

/// An accepted connection that fails once its [`Kill`] fired.
pub(crate) struct KillableIo {
    io: TcpStream,
    fired: Arc<AtomicBool>,
    notified: Pin<Box<OwnedNotified>>,
}

impl KillableIo {
    /// An error once the switch fired; otherwise registers the task to be woken when it does.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.fired.load(Ordering::SeqCst) || self.notified.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the server was killed",
            ));
        }
        Ok(())
    }
}

macro_rules! checked {
    ($self:ident, $cx:ident, $call:expr) => {{
        let this = $self.get_mut();
        if let Err(e) = this.check($cx) {
            return Poll::Ready(Err(e));
        }
        let io = Pin::new(&mut this.io);
        $call(io)
    }};
}

impl AsyncRead for KillableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        checked!(self, cx, |io: Pin<&mut TcpStream>| io.poll_read(cx, buf))
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        checked!(self, cx, |io: Pin<&mut TcpStream>| io.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        checked!(self, cx, |io: Pin<&mut TcpStream>| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        checked!(self, cx, |io: Pin<&mut TcpStream>| io.poll_shutdown(cx))
    }
}

impl Connected for KillableIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
