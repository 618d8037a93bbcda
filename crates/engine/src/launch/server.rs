//! The launcher's side: the real providers, served to one uid.

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use plimsoll_sandbox::{BrokerChannel, BrokerPort, OutputTap, Provider, RunningIn, error_chain};
use plimsoll_wire::Bytes;
use plimsoll_wire::launch::{DescribedProvider, LaunchAnswer, LaunchEvent, LaunchRequest, Ran};

use super::conn::{Receiver, Sender, split};
use super::{Bounds, failure_to_wire, image_from_wire, plan_from_wire, probed_to_wire};
use crate::providers::AnyProvider;

/// The providers, hosted for one peer uid.
#[derive(Debug)]
pub struct Launcher {
    providers: Vec<AnyProvider>,
    bounds: Bounds,
    peer_uid: u32,
}

impl Launcher {
    /// Hosts `providers` for the process running as `peer_uid`, within `bounds`.
    pub fn new(providers: Vec<AnyProvider>, bounds: Bounds, peer_uid: u32) -> Self {
        Launcher {
            providers,
            bounds,
            peer_uid,
        }
    }

    /// Serves every connection on `listener`, each on a thread of its own, until accepting
    /// fails.
    pub fn serve(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        loop {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            let me = Arc::clone(&self);
            std::thread::Builder::new()
                .name("launch".into())
                .spawn(move || {
                    if let Err(e) = me.connection(stream) {
                        tracing::warn!(error = %e, "a launcher connection failed");
                    }
                })?;
        }
    }

    fn connection(&self, stream: UnixStream) -> io::Result<()> {
        let peer = rustix::net::sockopt::socket_peercred(stream.as_fd())?;
        let (tx, mut rx) = split(stream)?;
        let uid = peer.uid.as_raw();
        if uid != self.peer_uid {
            return refuse(
                &tx,
                format!(
                    "uid {uid} (pid {}) is not the serving process's uid {}: the launcher takes requests from it alone",
                    peer.pid.as_raw_nonzero(),
                    self.peer_uid
                ),
            );
        }
        let request: LaunchRequest = match rx.recv() {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => return refuse(&tx, format!("a request the launcher cannot read: {e}")),
        };
        if let LaunchRequest::Describe = request {
            let described = self.providers.iter().map(describe).collect();
            return answer(&tx, LaunchAnswer::Described(described));
        }
        let name = match &request {
            LaunchRequest::Supports { provider, .. }
            | LaunchRequest::TakesImage { provider, .. }
            | LaunchRequest::MemoryFloor { provider, .. }
            | LaunchRequest::Probe { provider }
            | LaunchRequest::Adopt { provider, .. }
            | LaunchRequest::EnvironmentHolds { provider, .. }
            | LaunchRequest::Run { provider, .. }
            | LaunchRequest::Cancel { provider, .. } => provider.clone(),
            LaunchRequest::Describe | LaunchRequest::TearDown => {
                return refuse(&tx, "a teardown with no run before it".into());
            }
        };
        let Some(provider) = self.providers.iter().find(|p| p.name() == name) else {
            return refuse(&tx, format!("no provider `{name}` here"));
        };
        let said = |r: Result<(), String>| LaunchAnswer::Done(r);
        match request {
            LaunchRequest::Supports { spec, .. } => answer(
                &tx,
                said(provider.supports(&spec).map_err(|e| e.to_string())),
            ),
            LaunchRequest::TakesImage { image, .. } => answer(
                &tx,
                said(
                    provider
                        .takes_image(&image_from_wire(image))
                        .map_err(|e| e.to_string()),
                ),
            ),
            LaunchRequest::MemoryFloor { spec, .. } => {
                answer(&tx, LaunchAnswer::Floor(provider.memory_floor(&spec)))
            }
            LaunchRequest::Probe { .. } => {
                answer(&tx, LaunchAnswer::Probed(probed_to_wire(provider.probe())))
            }
            LaunchRequest::Adopt { evidence, .. } => answer(
                &tx,
                said(provider.adopt(&evidence).map_err(|e| e.to_string())),
            ),
            LaunchRequest::EnvironmentHolds { evidence, .. } => answer(
                &tx,
                said(
                    provider
                        .environment_holds(&evidence)
                        .map_err(|e| e.to_string()),
                ),
            ),
            LaunchRequest::Cancel { id, uid, .. } => {
                if let Err(why) = self.bounds.check_sandbox(&id, uid) {
                    return refuse(&tx, format!("a cancel outside the settings: {why}"));
                }
                let done = provider
                    .cancel(&RunningIn { id, uid })
                    .map_err(|e| error_chain(&e));
                answer(&tx, said(done))
            }
            LaunchRequest::Run { plan, .. } => {
                if let Err(why) = self.bounds.check(&plan) {
                    return refuse(&tx, format!("a plan outside the settings: {why}"));
                }
                self.run(provider, plan, tx, rx)
            }
            LaunchRequest::Describe | LaunchRequest::TearDown => unreachable!("answered above"),
        }
    }

    fn run(
        &self,
        provider: &AnyProvider,
        plan: plimsoll_wire::launch::Plan,
        tx: Sender,
        mut rx: Receiver,
    ) -> io::Result<()> {
        let tx = Arc::new(tx);
        let broker = plan.broker.map(|b| {
            BrokerChannel::new(Arc::new(Relay {
                tx: Arc::clone(&tx),
                egress: b.egress,
            }))
        });
        let tap = plan.tap.then(|| {
            let tx = Arc::clone(&tx);
            OutputTap::new(move |stream, offset, bytes| {
                let _ = tx.send(
                    &LaunchEvent::Output {
                        stream,
                        offset,
                        bytes: Bytes(bytes.to_vec()),
                    },
                    None,
                );
            })
        });
        let plan = plan_from_wire(plan, broker, tap);
        let (outcome, teardown) = match provider.run_then_tear_down(&plan) {
            Ok(done) => done,
            Err(e) => return answer(&tx, LaunchAnswer::Ran(Err(failure_to_wire(&e)))),
        };
        let ran = Ran {
            result: outcome.result,
            started_unix_ms: outcome.started_unix_ms,
            ended_unix_ms: outcome.ended_unix_ms,
            teardown: teardown.is_some(),
        };
        let sent = answer(&tx, LaunchAnswer::Ran(Ok(ran)));
        if let Some(teardown) = teardown {
            // Whatever comes next (the teardown asked for, or the caller gone), the sandbox
            // is removed: nothing of it is left behind.
            let _ = rx.recv::<LaunchRequest>();
            let done = teardown.run().map_err(|e| error_chain(&*e));
            answer(&tx, LaunchAnswer::Done(done))?;
        }
        sent
    }
}

fn describe(p: &AnyProvider) -> DescribedProvider {
    DescribedProvider {
        name: p.name().to_owned(),
        nominal_tier: p.nominal_tier(),
        cost: p.cost(),
        uses_image: p.uses_image(),
        supports_broker: p.supports_broker(),
        supports_egress: p.supports_egress(),
    }
}

fn answer(tx: &Sender, a: LaunchAnswer) -> io::Result<()> {
    tx.send(&LaunchEvent::Answer(Box::new(a)), None)
}

fn refuse(tx: &Sender, why: String) -> io::Result<()> {
    tracing::warn!(%why, "the launcher refused a request");
    answer(tx, LaunchAnswer::Refused(why))
}

/// The run's broker channel as the launcher's provider sees it: every end it makes is sent
/// back to the caller, whose broker serves it.
struct Relay {
    tx: Arc<Sender>,
    egress: bool,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("egress", &self.egress)
            .finish()
    }
}

impl BrokerPort for Relay {
    fn serve_stream(&self, stream: UnixStream) -> io::Result<()> {
        self.tx
            .send(&LaunchEvent::BrokerStream, Some(stream.as_fd()))
    }
    fn serve_listener(&self, listener: UnixListener) -> io::Result<()> {
        self.tx
            .send(&LaunchEvent::BrokerListener, Some(listener.as_fd()))
    }
    fn egress(&self) -> bool {
        self.egress
    }
}
