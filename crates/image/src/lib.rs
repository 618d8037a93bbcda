//! The image store: named root file systems, each identified by the SHA-256 of a manifest
//! of its whole content (docs/images.md). The engine resolves a request's `image` here; the
//! CLI lists, imports and removes images here. No HTTP and no provider: what runs in an
//! image is the providers' business (the sandbox crate is linked for its spawn helper only).

pub mod disk;
pub mod import;
pub mod in_use;
pub mod manifest;
pub mod store;
#[doc(hidden)]
pub mod testing;

pub use disk::{MakeVmDiskError, make_vm_disk};
pub use import::{ImportImageError, Imported, Limits, Neutralised, Source, SourceForm, import};
pub use in_use::processes_using;
pub use manifest::{MakeManifestError, identity, manifest};
pub use store::{
    ImageDir, ImageStore, Language, ListImagesError, Listing, ResolveImageError, StoredImage,
    executable_in_root, interpreter_path, resolve_in_root,
};
