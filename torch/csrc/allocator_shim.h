// The C interface of allocator_shim.cpp, declared once. The Rust side (src/ffi.rs) mirrors these
// structs with #[repr(C)] and checks the same sizes and offsets at compile time; the static_asserts
// below check them on the C++ side, so a change on one side alone fails the build.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Every counter is non-negative; the shim converts PyTorch's signed counters once, here.
struct igl_memory_stats {
  uint64_t allocated_current, allocated_peak;
  uint64_t reserved_current, reserved_peak;
  uint64_t requested_current, requested_peak;
  uint64_t segments_current, allocations_current;
  uint64_t alloc_retries, ooms;
  uint64_t inactive_split_current, inactive_split_bytes_current;
};

struct igl_device_properties {
  char name[256];
  int32_t major, minor, multiprocessor_count;
  uint64_t total_memory;
};

// The settings the caching allocator runs with, as it reports them.
struct igl_allocator_settings {
  uint64_t expandable_segments;  // 1 when AcceleratorAllocatorConfig::use_expandable_segments()
  uint64_t large_segment_size;   // AcceleratorAllocatorConfig::large_segment_size()
  uint64_t max_split_size;       // AcceleratorAllocatorConfig::max_split_size(), SIZE_MAX: unlimited
};

struct igl_versions {
  char torch[32];
  int64_t cuda_build;       // CUDART_VERSION libtorch was compiled with, 0 if none
  int64_t cuda_runtime;     // cudaRuntimeGetVersion of the loaded runtime, 0 if unavailable
  int64_t cuda_driver_api;  // cudaDriverGetVersion, 0 if no driver
  int64_t cudnn_build;      // cuDNN version libtorch was compiled with, 0 if none
  int64_t cudnn_runtime;    // cuDNN version loaded at run time, 0 if none
};

const char* igl_last_error(void);
int igl_versions(struct igl_versions* out);
int igl_init_device(int device);
int igl_memory_stats(int device, struct igl_memory_stats* out);
int igl_reset_peak_stats(int device);
int igl_synchronize(int device);
int igl_empty_cache(void);
int igl_mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);
int igl_device_properties(int device, struct igl_device_properties* out);
int igl_event_create(void** event);
int igl_event_record(void* event, int device);
int igl_event_elapsed_ms(void* start, void* end, float* ms);
void igl_event_destroy(void* event);
// The caching allocator's map of `device` as text, valid until the next call on this thread:
// a line "S address total_size is_large stream is_expandable" per segment (with expandable
// segments: per contiguous mapped range), in address order, each followed by a line
// "B address size requested_size allocated" per block, in address order.
int igl_snapshot(int device, const char** text);
// The allocator's settings, and the configuration text it parsed (empty when none; valid until
// the next call on this thread).
int igl_allocator_settings(struct igl_allocator_settings* out, const char** text);

#ifdef __cplusplus
}  // extern "C"

// The layout the Rust declarations assume (src/ffi.rs asserts the same numbers).
static_assert(sizeof(struct igl_memory_stats) == 96, "igl_memory_stats layout");
static_assert(offsetof(struct igl_memory_stats, ooms) == 72, "igl_memory_stats layout");
static_assert(offsetof(struct igl_memory_stats, inactive_split_bytes_current) == 88, "igl_memory_stats layout");
static_assert(sizeof(struct igl_device_properties) == 280, "igl_device_properties layout");
static_assert(offsetof(struct igl_device_properties, major) == 256, "igl_device_properties layout");
static_assert(offsetof(struct igl_device_properties, total_memory) == 272, "igl_device_properties layout");
static_assert(sizeof(struct igl_allocator_settings) == 24, "igl_allocator_settings layout");
static_assert(offsetof(struct igl_allocator_settings, max_split_size) == 16, "igl_allocator_settings layout");
static_assert(sizeof(struct igl_versions) == 72, "igl_versions layout");
static_assert(offsetof(struct igl_versions, cuda_build) == 32, "igl_versions layout");
static_assert(offsetof(struct igl_versions, cudnn_runtime) == 64, "igl_versions layout");
#endif
