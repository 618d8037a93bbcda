//! plimsolld: HTTP/JSON in front of the engine. The only crate that knows HTTP servers.

pub mod testing {
    //! An in-process daemon for tests of other crates.

    /// A daemon serving on a loopback port, stopped when dropped.
    #[derive(Debug)]
    pub struct TestDaemon {
        /// Base URL, e.g. `http://127.0.0.1:43121`.
        pub url: String,
        /// A caller token valid on it (caller name `test`).
        pub token: String,
    }

    impl TestDaemon {
        /// Starts a daemon with these settings (TOML, as in a settings file; `[daemon]` keys
        /// other than limits are overridden: it listens on an ephemeral loopback port and uses
        /// a fresh callers file holding one caller `test`).
        pub fn start(settings_toml: &str) -> TestDaemon {
            let _ = settings_toml;
            unimplemented!("TestDaemon::start")
        }
    }
}
