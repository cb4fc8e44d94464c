//! The exports (NVMe namespaces) of a device: each a range of its logical space with its own
//! bounds and placement, laid out and checked at start; and the names a client serves them by
//! (`NAME`, or `NAME@VOLUME` for a snapshot or clone of a durable device).

use crate::{Device, DeviceError, DeviceOptions, ExportSpec, Placement};
use ftlab_store::durable::VolumeKind;
use std::sync::atomic::AtomicU64;

/// An export as served: where it lies on the device, and what its clients did.
pub(crate) struct Export {
    pub(crate) spec: ExportSpec,
    pub(crate) base_bytes: u64,
    pub(crate) size_bytes: u64,
    pub(crate) requests: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) written_bytes: AtomicU64,
    pub(crate) trimmed_bytes: AtomicU64,
}

impl Export {
    /// The device placement of a write at `offset` (within the export): its placement ID, the
    /// handle resolved through the export's placement handle list.
    pub(crate) fn placement_of(&self, offset: u64) -> Placement {
        let pid = match &self.spec.ranges {
            Some(r) => r.placement_of(offset),
            None => self.spec.placement,
        };
        self.spec.resolve(pid)
    }
}

impl ExportSpec {
    /// The device's (reclaim group, handle) for placement ID `pid` (checked at start).
    fn resolve(&self, pid: Placement) -> Placement {
        Placement {
            reclaim_group: pid.reclaim_group,
            handle: match self.handles.get(usize::from(pid.handle)) {
                Some(&h) => h,
                None => pid.handle,
            },
        }
    }
}

fn specs_named(exports: &[Export], name: &str) -> bool {
    exports.iter().any(|e| e.spec.name == name)
}

/// What a connection serves: an export (an index into the device's), on the device itself
/// (volume 0) or on a snapshot or clone of a durable device (`NAME@VOLUME`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub export: usize,
    pub volume: u16,
    /// A snapshot: read-only.
    pub snapshot: bool,
}

impl Device {
    /// The exports in order on the device's logical space, each checked: a known name, whole
    /// pages, room on the device, a placement the device has.
    pub(crate) fn lay_out_exports(
        options: &DeviceOptions,
        geometry: &ftlab_core::geometry::Geometry,
    ) -> Result<Vec<Export>, DeviceError> {
        let device_bytes = geometry.logical_bytes();
        let specs = if options.exports.is_empty() {
            vec![ExportSpec {
                name: options.export_name.clone(),
                ..Default::default()
            }]
        } else {
            options.exports.clone()
        };
        let page = u64::from(geometry.page_size_bytes);
        let mut base = 0u64;
        let mut exports = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let bad = |why: String| DeviceError::Export(format!("export `{}`: {why}", spec.name));
            if specs_named(&exports, &spec.name) {
                return Err(bad("named twice".into()));
            }
            if spec.name.is_empty() && i > 0 {
                return Err(bad("only the first export may have the empty name".into()));
            }
            let left = device_bytes - base;
            let size = spec.size_bytes.unwrap_or(left);
            if size == 0 || size % page != 0 {
                return Err(bad(format!(
                    "{size} bytes: an export is a positive number of whole {page}-byte pages"
                )));
            }
            if size > left {
                return Err(bad(format!(
                    "{size} bytes do not fit: the exports before it leave {left} of the device's {device_bytes} (size the device with --set capacity.logical_bytes=BYTES)"
                )));
            }
            let pids: Vec<Placement> = spec
                .ranges
                .iter()
                .flat_map(|r| r.ranges().iter().map(|r| r.placement))
                .chain([spec.placement])
                .collect();
            for pid in pids {
                if !spec.handles.is_empty() && usize::from(pid.handle) >= spec.handles.len() {
                    return Err(bad(format!(
                        "placement handle {} is beyond its list of {} (handles=)",
                        pid.handle,
                        spec.handles.len()
                    )));
                }
                let p = spec.resolve(pid);
                if u32::from(p.handle) >= geometry.handles
                    || u32::from(p.reclaim_group) >= geometry.reclaim_groups
                {
                    return Err(bad(format!(
                        "placement {}:{} is not on the device ({} reclaim group(s) of {} handle(s): fdp.reclaim_groups, fdp.handles or ftl.streams)",
                        p.reclaim_group, p.handle, geometry.reclaim_groups, geometry.handles
                    )));
                }
            }
            exports.push(Export {
                spec,
                base_bytes: base,
                size_bytes: size,
                requests: AtomicU64::new(0),
                read_bytes: AtomicU64::new(0),
                written_bytes: AtomicU64::new(0),
                trimmed_bytes: AtomicU64::new(0),
            });
            base += size;
        }
        Ok(exports)
    }

    /// Each export's name and size, in order on the device.
    pub fn export_sizes(&self) -> Vec<(String, u64)> {
        self.exports
            .iter()
            .map(|e| (e.spec.name.clone(), e.size_bytes))
            .collect()
    }

    /// The export a client names: "" is the first.
    /// The export `name` names: an export's name ("" the first), or `EXPORT@VOLUME` for a
    /// snapshot or clone of a durable device (`@VOLUME` alone: of the first export).
    pub fn export_named(&self, name: &str) -> Option<Target> {
        let (export, volume) = match name.split_once('@') {
            Some((e, v)) => (e, Some(v)),
            None => (name, None),
        };
        let export = if export.is_empty() {
            0
        } else {
            self.exports.iter().position(|e| e.spec.name == export)?
        };
        match volume {
            None => Some(Target {
                export,
                ..Target::default()
            }),
            Some(v) => {
                let (volume, kind) = self.durable.as_ref()?.lock().volume_named(v)?;
                Some(Target {
                    export,
                    volume,
                    snapshot: kind == VolumeKind::Snapshot,
                })
            }
        }
    }

    /// The name a policy knows an export by: `NAME`, or `NAME@VOLUME` for a snapshot or clone
    /// (the default export's name when the client asked for "").
    pub fn target_name(&self, target: Target) -> String {
        let export = &self.exports[target.export].spec.name;
        if target.volume == 0 {
            return export.clone();
        }
        let volume = self
            .durable
            .as_ref()
            .and_then(|d| {
                d.lock()
                    .volumes()
                    .into_iter()
                    .find(|v| v.id == target.volume)
                    .map(|v| v.name)
            })
            .unwrap_or_default();
        format!("{export}@{volume}")
    }

    /// The name a policy decides snapshot actions on: the first export's `NAME@VOLUME` (a
    /// snapshot or clone is of the whole device, served on every export).
    pub fn volume_export_name(&self, volume: &str) -> String {
        format!("{}@{volume}", self.exports[0].spec.name)
    }

    /// The size of the export `target` is on.
    pub fn export_size_bytes(&self, target: Target) -> u64 {
        self.exports[target.export].size_bytes
    }

    /// Whether `target` takes no changes: the device, its export, or a snapshot read-only.
    pub fn is_read_only(&self, target: Target) -> bool {
        self.options.read_only || self.exports[target.export].spec.read_only || target.snapshot
    }
}
