//! Replies: what comes back from the attached backend and where it goes. Client-owned replies
//! are relayed (flushed when nothing more is buffered), proxy-owned ones are consumed, a held-back
//! replica reply is released or — on 25006 — discarded and its flight re-run on the primary, and
//! a broken backend turns into errors for the replies still due. Sending is `flight.rs`.

use super::flight::Owner;
use super::session::Session;
use crate::backend::{BackendError, Target};
use crate::net::backend::build;
use crate::net::{BackendMessage, ErrorFields, Frame, FrontendMessage};

impl Session {
    /// Relays replies until none are due.
    pub(super) async fn drain(&mut self) -> anyhow::Result<()> {
        while let Some(b) = self.backend.as_mut() {
            if b.expect.is_empty() || b.copy_in {
                break;
            }
            let frame = b.conn.recv().await;
            self.on_backend(frame).await?;
        }
        Ok(())
    }

    /// COPY data from the client goes straight to the attached backend, even before its
    /// CopyInResponse arrived (asyncpg streams data right behind the COPY query); PostgreSQL
    /// drops COPY messages outside COPY mode, and the proxy drops them when nothing is attached.
    pub(super) async fn copy_from_client(
        &mut self,
        message: FrontendMessage,
    ) -> anyhow::Result<()> {
        let Some(attached) = self.backend.as_mut() else {
            return Ok(());
        };
        if let Err(e) = attached.conn.send(&[message.to_frame()]).await {
            return self.backend_lost(e).await;
        }
        Ok(())
    }

    /// Handles one reply from the attached backend.
    pub(super) async fn on_backend(
        &mut self,
        frame: Result<Frame, BackendError>,
    ) -> anyhow::Result<()> {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return self.backend_lost(e).await,
        };
        let attached = self.backend.as_mut().expect("replies only while attached");
        let message = match attached.conn.parse(&frame) {
            Ok(m) => m,
            Err(e) => return self.backend_lost(e).await,
        };
        let owner = attached.expect.front().copied().unwrap_or(Owner::Client);
        tracing::trace!(tag = %(frame.tag as char), ?owner, expect = attached.expect.len(), "← backend");
        if attached.copy_in
            && matches!(
                message,
                BackendMessage::ErrorResponse(_) | BackendMessage::ReadyForQuery(_)
            )
        {
            attached.copy_in = false;
        }
        if attached.copy_in && frame.tag == b'C' {
            attached.copy_in = false;
        }
        match message {
            BackendMessage::ReadyForQuery(status) => {
                attached.expect.pop_front();
                attached.error_relayed = false;
                if owner == Owner::Proxy {
                    return Ok(());
                }
                return self.client_ready(frame, status).await;
            }
            BackendMessage::CopyInResponse | BackendMessage::CopyBothResponse => {
                attached.copy_in = true;
                if attached.extended {
                    // The Sync already sent behind Execute is ignored in COPY IN mode; the
                    // client sends another after CopyDone.
                    attached.expect.pop_front();
                    attached.open = true;
                }
                if let Some(retry) = attached.retry.take() {
                    retry.frames.iter().for_each(|f| self.io.queue(f));
                }
            }
            BackendMessage::ErrorResponse(ref e) if owner == Owner::Proxy => {
                tracing::warn!(node = %attached.conn.address, "statement lsngate added failed: {:?}", e.get(b'M'));
                return Ok(());
            }
            BackendMessage::ErrorResponse(ref e) if e.sqlstate() == Some("25006") => {
                if let Some(retry) = attached.retry.as_mut() {
                    retry.read_only_violation = true;
                }
                attached.error_relayed = true;
            }
            BackendMessage::ErrorResponse(mut e) => {
                attached.error_relayed = true;
                if matches!(e.get(b'S'), Some("FATAL" | "PANIC")) {
                    attached.doomed = true;
                    // The server connection ends, the client's does not: to the client this is
                    // an ERROR, followed by ReadyForQuery when the loss is noticed.
                    for (code, value) in e.fields.iter_mut() {
                        if *code == b'S' || *code == b'V' {
                            *value = "ERROR".into();
                        }
                    }
                    return self.relay(e.to_frame(b'E')).await;
                }
            }
            _ if owner == Owner::Proxy => return Ok(()),
            _ => {}
        }
        self.relay(frame).await
    }

    async fn relay(&mut self, frame: Frame) -> anyhow::Result<()> {
        let limit = self.config.retry_buffer_size;
        let attached = self.backend.as_mut().expect("attached");
        if let Some(retry) = attached.retry.as_mut() {
            retry.bytes += frame.body.len() + 5;
            retry.frames.push(frame);
            if retry.bytes > limit && !retry.read_only_violation {
                // Too much to hold: hand it over; a later 25006 then reaches the client as is.
                let retry = attached.retry.take().expect("checked");
                retry.frames.iter().for_each(|f| self.io.queue(f));
            } else {
                return Ok(());
            }
        } else {
            self.io.queue(&frame);
        }
        let more_buffered = self.backend.as_ref().is_some_and(|b| b.conn.has_frame());
        if !more_buffered || self.io.queued() > 64 * 1024 {
            self.io.flush().await?;
        }
        Ok(())
    }

    async fn client_ready(&mut self, frame: Frame, status: u8) -> anyhow::Result<()> {
        let attached = self.backend.as_mut().expect("attached");
        if let Some(retry) = attached.retry.take() {
            if retry.read_only_violation && status == b'I' {
                metrics::counter!("lsngate_proxy_retries_total", "reason" => "read_only")
                    .increment(1);
                tracing::debug!("replica refused a write (25006); re-running on the primary");
                self.release_backend();
                return Box::pin(self.dispatch_to(
                    retry.flight,
                    retry.class,
                    Some(Target::Primary),
                ))
                .await;
            }
            retry.frames.iter().for_each(|f| self.io.queue(f));
        }
        self.status = status;
        self.io.queue(&frame);
        self.maybe_release();
        self.io.flush().await?;
        Ok(())
    }

    /// The backend broke. Replies still due become errors; only a replica read (which cannot
    /// have written) is re-run, on the primary.
    pub(super) async fn backend_lost(&mut self, error: BackendError) -> anyhow::Result<()> {
        let Some(attached) = self.backend.take() else {
            return Ok(());
        };
        *self.cancel_slot.lock().expect("cancel slot") = None;
        metrics::counter!("lsngate_proxy_errors_total", "kind" => "backend_lost").increment(1);
        tracing::warn!("backend lost mid-flight: {error}");
        if let Some(retry) = attached
            .retry
            .filter(|_| attached.target == Target::Replica)
        {
            metrics::counter!("lsngate_proxy_retries_total", "reason" => "replica_lost")
                .increment(1);
            return Box::pin(self.dispatch_to(retry.flight, retry.class, Some(Target::Primary)))
                .await;
        }
        let waiting = attached
            .expect
            .iter()
            .filter(|o| **o == Owner::Client)
            .count();
        let waiting = if waiting == 0 && (attached.open || attached.copy_in || self.status != b'I')
        {
            1
        } else {
            waiting
        };
        let rolled_back = if self.status != b'I' {
            "; the open transaction was rolled back"
        } else {
            ""
        };
        let message = format!(
            "lsngate lost the server connection while it ran your statement ({error}); it was not retried because it may have written{rolled_back}"
        );
        for _ in 0..waiting {
            self.io
                .queue(&ErrorFields::new("ERROR", "08006", message.clone()).to_frame(b'E'));
            self.io.queue(&build::ready_for_query(b'I'));
        }
        self.status = b'I';
        if waiting == 0 && self.pinned {
            self.io.queue(&super::listener::fatal("08006", &message));
            self.io.flush().await?;
            anyhow::bail!(message);
        }
        self.io.flush().await?;
        Ok(())
    }
}
