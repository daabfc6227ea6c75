# DLPack 1.3's C layout as the shared reader (pydsa/_read.pyx) uses it: the tensor view and the C exchange API table
# a framework's tensor type carries (`__dlpack_c_exchange_api__`). Declarations only; nothing of pydsa's.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef int (*DLTensorFromPyObject)(void* py_object, DLTensor* out) noexcept
ctypedef int (*CurrentWorkStream)(int32_t device_type, int32_t device_id, void** out) noexcept

cdef struct ExchangeAPI:
    uint32_t major
    uint32_t minor
    void* prev_api
    void* managed_tensor_allocator
    void* managed_tensor_from_py_object_no_sync
    void* managed_tensor_to_py_object_no_sync
    DLTensorFromPyObject dltensor_from_py_object_no_sync
    CurrentWorkStream current_work_stream
