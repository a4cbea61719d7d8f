//! The only `unsafe` code of the crate: the declarations of `csrc/allocator_shim.h` and safe
//! wrappers (tensors are passed as the `torch::Tensor*` a tch tensor holds). Every shim call
//! returns a status; a non-zero status carries the C++ exception's message, read here and returned
//! as an `Err`. The structs' sizes and offsets are asserted below with the same numbers as the
//! header's `static_assert`s.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStats {
    pub allocated_current: u64,
    pub allocated_peak: u64,
    pub reserved_current: u64,
    pub reserved_peak: u64,
    pub requested_current: u64,
    pub requested_peak: u64,
    pub segments_current: u64,
    pub allocations_current: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
    pub inactive_split_current: u64,
    pub inactive_split_bytes_current: u64,
}

#[repr(C)]
pub struct DeviceProperties {
    pub name: [c_char; 256],
    pub major: i32,
    pub minor: i32,
    pub multiprocessor_count: i32,
    pub total_memory: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AllocatorSettings {
    pub expandable_segments: u64,
    pub large_segment_size: u64,
    pub max_split_size: u64,
}

#[repr(C)]
#[derive(Default)]
pub struct Versions {
    pub torch: [c_char; 32],
    pub cuda_build: i64,
    pub cuda_runtime: i64,
    pub cuda_driver_api: i64,
    pub cudnn_build: i64,
    pub cudnn_runtime: i64,
}

// The layout `csrc/allocator_shim.h` asserts on the C++ side.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<MemoryStats>() == 96 && offset_of!(MemoryStats, ooms) == 72);
    assert!(offset_of!(MemoryStats, inactive_split_bytes_current) == 88);
    assert!(size_of::<DeviceProperties>() == 280);
    assert!(offset_of!(DeviceProperties, major) == 256);
    assert!(offset_of!(DeviceProperties, total_memory) == 272);
    assert!(size_of::<AllocatorSettings>() == 24);
    assert!(offset_of!(AllocatorSettings, max_split_size) == 16);
    assert!(size_of::<Versions>() == 72 && offset_of!(Versions, cuda_build) == 32);
    assert!(offset_of!(Versions, cudnn_runtime) == 64);
};

extern "C" {
    fn igl_last_error() -> *const c_char;
    fn igl_versions(out: *mut Versions) -> c_int;
    fn igl_init_device(device: c_int) -> c_int;
    fn igl_memory_stats(device: c_int, out: *mut MemoryStats) -> c_int;
    fn igl_reset_peak_stats(device: c_int) -> c_int;
    fn igl_synchronize(device: c_int) -> c_int;
    fn igl_empty_cache() -> c_int;
    fn igl_mem_get_info(device: c_int, free: *mut u64, total: *mut u64) -> c_int;
    fn igl_device_properties(device: c_int, out: *mut DeviceProperties) -> c_int;
    fn igl_event_create(event: *mut *mut c_void) -> c_int;
    fn igl_event_record(event: *mut c_void, device: c_int) -> c_int;
    fn igl_event_elapsed_ms(start: *mut c_void, end: *mut c_void, ms: *mut f32) -> c_int;
    fn igl_event_destroy(event: *mut c_void);
    fn igl_snapshot(device: c_int, text: *mut *const c_char) -> c_int;
    fn igl_allocator_settings(out: *mut AllocatorSettings, text: *mut *const c_char) -> c_int;
}

/// Turns a shim status into a Result, taking the message of a caught C++ exception.
fn checked(status: c_int) -> Result<(), String> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: the shim returns a pointer to its thread-local string, valid until the next call
    // on this thread; it is copied at once.
    Err(unsafe { CStr::from_ptr(igl_last_error()) }
        .to_string_lossy()
        .into_owned())
}

fn text(chars: &[c_char]) -> String {
    // SAFETY: the shim always NUL-terminates these fixed buffers (snprintf / memset).
    unsafe { CStr::from_ptr(chars.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn index(device: u32) -> c_int {
    c_int::try_from(device).unwrap_or(c_int::MAX)
}

pub fn versions() -> Result<(String, Versions), String> {
    let mut v = Versions::default();
    // SAFETY: `v` is a valid, writable Versions.
    checked(unsafe { igl_versions(&mut v) })?;
    Ok((text(&v.torch), v))
}

pub fn init_device(device: u32) -> Result<(), String> {
    // SAFETY: plain value argument.
    checked(unsafe { igl_init_device(index(device)) })
}

pub fn memory_stats(device: u32) -> Result<MemoryStats, String> {
    let mut s = MemoryStats::default();
    // SAFETY: `s` is a valid, writable MemoryStats.
    checked(unsafe { igl_memory_stats(index(device), &mut s) })?;
    Ok(s)
}

pub fn reset_peak_stats(device: u32) -> Result<(), String> {
    // SAFETY: plain value argument.
    checked(unsafe { igl_reset_peak_stats(index(device)) })
}

/// Waits for all work on `device` (`torch.cuda.synchronize`).
pub fn synchronize(device: u32) -> Result<(), String> {
    // SAFETY: plain value argument.
    checked(unsafe { igl_synchronize(index(device)) })
}

/// Returns the allocator's unused cached blocks to the driver (`torch.cuda.empty_cache`).
pub fn empty_cache() -> Result<(), String> {
    // SAFETY: no arguments.
    checked(unsafe { igl_empty_cache() })
}

/// (free, total) bytes as `cudaMemGetInfo` reports them for `device`.
pub fn mem_get_info(device: u32) -> Result<(u64, u64), String> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: both pointers are valid and writable.
    checked(unsafe { igl_mem_get_info(index(device), &mut free, &mut total) })?;
    Ok((free, total))
}

pub struct Properties {
    pub name: String,
    pub major: i32,
    pub minor: i32,
    pub multiprocessors: u32,
    pub total_memory: u64,
}

pub fn device_properties(device: u32) -> Result<Properties, String> {
    let mut p = DeviceProperties {
        name: [0; 256],
        major: 0,
        minor: 0,
        multiprocessor_count: 0,
        total_memory: 0,
    };
    // SAFETY: `p` is a valid, writable DeviceProperties.
    checked(unsafe { igl_device_properties(index(device), &mut p) })?;
    Ok(Properties {
        name: text(&p.name),
        major: p.major,
        minor: p.minor,
        multiprocessors: u32::try_from(p.multiprocessor_count).unwrap_or(0),
        total_memory: p.total_memory,
    })
}

/// The caching allocator's map of `device`, as the text the shim writes (see `allocator_shim.h`).
pub fn snapshot(device: u32) -> Result<String, String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer; on success it points at the shim's thread-local
    // string, valid until the next call on this thread, and is copied at once.
    checked(unsafe { igl_snapshot(index(device), &mut text) })?;
    Ok(unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned())
}

/// The caching allocator's settings as it reports them, and the configuration text it parsed.
pub fn allocator_settings() -> Result<(AllocatorSettings, String), String> {
    let mut out = AllocatorSettings::default();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `out` is a valid, writable AllocatorSettings and `text` a valid out-pointer; on
    // success `text` points at the shim's thread-local string, valid until the next call on this
    // thread, and is copied at once.
    checked(unsafe { igl_allocator_settings(&mut out, &mut text) })?;
    let parsed = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    Ok((out, parsed))
}

/// Asks the kernel to kill this process when the thread that started it ends (Linux
/// `PR_SET_PDEATHSIG`), then checks that the parent is still `parent`: when it already ended
/// before the request, the request cannot fire, and `false` says so.
pub fn die_with_parent(parent: u32) -> bool {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointer; getppid has no
    // arguments and cannot fail.
    let set = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } == 0;
    set && u32::try_from(unsafe { libc::getppid() }).ok() == Some(parent)
}

/// A CUDA event, destroyed on drop.
pub struct CudaEvent(*mut c_void);

impl CudaEvent {
    pub fn new() -> Result<CudaEvent, String> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer.
        checked(unsafe { igl_event_create(&mut e) })?;
        Ok(CudaEvent(e))
    }

    /// Records the event on `device`'s current stream.
    pub fn record(&self, device: u32) -> Result<(), String> {
        // SAFETY: self.0 is a live event created by igl_event_create.
        checked(unsafe { igl_event_record(self.0, index(device)) })
    }

    /// Milliseconds between `self` and a later `end`, waiting for `end` to complete.
    pub fn elapsed_ms(&self, end: &CudaEvent) -> Result<f64, String> {
        let mut ms = 0f32;
        // SAFETY: both events are live; `ms` is writable.
        checked(unsafe { igl_event_elapsed_ms(self.0, end.0, &mut ms) })?;
        Ok(f64::from(ms))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: self.0 was created by igl_event_create and is destroyed once.
        unsafe { igl_event_destroy(self.0) }
    }
}
