/*
 * TEST STAND-IN -- NOT NVIDIA CODE, NOT A DRIVER.
 *
 * nvstandin.h: the NVIDIA ioctl ABI (driver 580 layouts, x86-64) as far as the
 * gputrace test stand-in needs it, shared by nvfuse.c (the fake driver) and
 * workload.c (the known workload that drives it), plus the workload's tables.
 *
 * Every size and offset asserted below comes from docs/driver-facts.md
 * sections 1.2-1.4 and 2.2-2.4 ("latest" there is 595; where 580 differs, section 1.4
 * says so and the 580 layout is used: UVM_FREE_PARAMS still has `length`).
 * The few layouts that the facts file does not list are marked "not in facts".
 */
#ifndef NVSTANDIN_H
#define NVSTANDIN_H

#include <stddef.h>
#include <stdint.h>
#include <linux/ioctl.h>

typedef uint8_t NvU8;
typedef uint32_t NvU32;
typedef int32_t NvS32;
typedef int16_t NvS16;
typedef uint16_t NvU16;
typedef uint64_t NvU64;
typedef uint32_t NvHandle;
typedef uint32_t NvV32;
typedef uint8_t NvBool;
typedef uint32_t NV_STATUS;
/* NvP64 is a user pointer carried as 8 aligned bytes whatever the caller's ABI. */
typedef uint64_t NvP64 __attribute__((aligned(8)));
typedef uint64_t NvU64A __attribute__((aligned(8)));

#define NVSA_SIZE(T, n) _Static_assert(sizeof(T) == (n), #T " size")
#define NVSA_OFF(T, f, n) _Static_assert(offsetof(T, f) == (n), #T "." #f " offset")

/* ---- NV_STATUS values (src/common/sdk/nvidia/inc/nvstatuscodes.h) ---- */
#define NV_OK 0x00000000u
#define NV_ERR_ILLEGAL_ACTION 0x00000016u
#define NV_ERR_INSERT_DUPLICATE_NAME 0x00000019u
#define NV_ERR_INSUFFICIENT_PERMISSIONS 0x0000001Bu
#define NV_ERR_INVALID_ADDRESS 0x0000001Eu
#define NV_ERR_INVALID_ARGUMENT 0x0000001Fu
#define NV_ERR_INVALID_LIMIT 0x0000002Eu
#define NV_ERR_INVALID_OBJECT_HANDLE 0x00000033u
#define NV_ERR_INVALID_OBJECT_PARENT 0x00000036u
#define NV_ERR_NO_MEMORY 0x00000051u
#define NV_ERR_NOT_SUPPORTED 0x00000056u
#define NV_ERR_OBJECT_NOT_FOUND 0x00000057u
#define NV_ERR_INVALID_DEVICE 0x00000026u
#define NV_ERR_UVM_ADDRESS_IN_USE 0x00000068u
#define NV_WARN_NOTHING_TO_DO 0x00010006u

/* ---- RM escapes (section 2.2) ---- */
#define NV_IOCTL_MAGIC 'F'
#define NV_ESC_RM_ALLOC_MEMORY 0x27
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_RM_DUP_OBJECT 0x34
#define NV_ESC_RM_VID_HEAP_CONTROL 0x4A
#define NV_ESC_RM_MAP_MEMORY 0x4E
#define NV_ESC_RM_UNMAP_MEMORY 0x4F
#define NV_ESC_REGISTER_FD 201
#define NV_ESC_IOCTL_XFER_CMD 211
#define NV_ABSOLUTE_MAX_IOCTL_SIZE 16384

/* ---- RM parameter structs (section 2.3) ---- */
typedef struct {
    NvHandle hRoot;
    NvHandle hObjectParent;
    NvHandle hObjectOld;
    NvV32 status;
} NVOS00_PARAMETERS;
NVSA_SIZE(NVOS00_PARAMETERS, 16);
NVSA_OFF(NVOS00_PARAMETERS, hObjectOld, 8);
NVSA_OFF(NVOS00_PARAMETERS, status, 12);

typedef struct {
    NvHandle hRoot;
    NvHandle hObjectParent;
    NvHandle hObjectNew;
    NvV32 hClass;
    NvP64 pAllocParms;
    NvU32 paramsSize;
    NvV32 status;
} NVOS21_PARAMETERS;
NVSA_SIZE(NVOS21_PARAMETERS, 32);
NVSA_OFF(NVOS21_PARAMETERS, hObjectNew, 8);
NVSA_OFF(NVOS21_PARAMETERS, hClass, 12);
NVSA_OFF(NVOS21_PARAMETERS, pAllocParms, 16);
NVSA_OFF(NVOS21_PARAMETERS, paramsSize, 24);
NVSA_OFF(NVOS21_PARAMETERS, status, 28);

typedef struct {
    NvHandle hRoot;
    NvHandle hObjectParent;
    NvHandle hObjectNew;
    NvV32 hClass;
    NvP64 pAllocParms;
    NvP64 pRightsRequested;
    NvU32 paramsSize;
    NvU32 flags;
    NvV32 status;
} NVOS64_PARAMETERS;
NVSA_SIZE(NVOS64_PARAMETERS, 48);
NVSA_OFF(NVOS64_PARAMETERS, pAllocParms, 16);
NVSA_OFF(NVOS64_PARAMETERS, pRightsRequested, 24);
NVSA_OFF(NVOS64_PARAMETERS, paramsSize, 32);
NVSA_OFF(NVOS64_PARAMETERS, flags, 36);
NVSA_OFF(NVOS64_PARAMETERS, status, 40);

typedef struct {
    NvHandle hRoot;
    NvHandle hObjectParent;
    NvHandle hObjectNew;
    NvV32 hClass;
    NvV32 flags;
    NvP64 pMemory;
    NvU64A limit;
    NvV32 status;
} NVOS02_PARAMETERS;
NVSA_SIZE(NVOS02_PARAMETERS, 48);
NVSA_OFF(NVOS02_PARAMETERS, flags, 16);
NVSA_OFF(NVOS02_PARAMETERS, pMemory, 24);
NVSA_OFF(NVOS02_PARAMETERS, limit, 32);
NVSA_OFF(NVOS02_PARAMETERS, status, 40);

typedef struct {
    NVOS02_PARAMETERS params;
    int fd;
} nv_ioctl_nvos02_parameters_with_fd;
NVSA_SIZE(nv_ioctl_nvos02_parameters_with_fd, 56);
NVSA_OFF(nv_ioctl_nvos02_parameters_with_fd, fd, 48);

typedef struct {
    NvHandle owner;
    NvHandle hMemory;
    NvU32 type;
    NvU32 flags;
    NvU32 attr;
    NvU32 format;
    NvU32 comprCovg;
    NvU32 zcullCovg;
    NvU32 partitionStride;
    NvU32 width;
    NvU32 height;
    NvU64A size;
    NvU64A alignment;
    NvU64A offset;
    NvU64A limit;
    NvP64 address;
} NVOS32_ALLOC_SIZE; /* leading part of NVOS32 data.AllocSize; the rest stays opaque */

typedef struct {
    NvHandle owner;
    NvHandle hMemory;
    NvU32 flags;
} NVOS32_FREE;

typedef struct {
    NvHandle hRoot;
    NvHandle hObjectParent;
    NvU32 function;
    NvHandle hVASpace;
    NvS16 ivcHeapNumber;
    NvV32 status;
    NvU64A total;
    NvU64A free;
    union {
        NVOS32_ALLOC_SIZE AllocSize;
        NVOS32_FREE Free;
        NvU8 raw[144];
    } __attribute__((aligned(8))) data;
} NVOS32_PARAMETERS;
NVSA_SIZE(NVOS32_PARAMETERS, 184);
NVSA_OFF(NVOS32_PARAMETERS, function, 8);
NVSA_OFF(NVOS32_PARAMETERS, hVASpace, 12);
NVSA_OFF(NVOS32_PARAMETERS, ivcHeapNumber, 16);
NVSA_OFF(NVOS32_PARAMETERS, status, 20);
NVSA_OFF(NVOS32_PARAMETERS, total, 24);
NVSA_OFF(NVOS32_PARAMETERS, free, 32);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.owner, 40);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.hMemory, 44);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.type, 48);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.flags, 52);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.attr, 56);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.size, 88);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.alignment, 96);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.offset, 104);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.limit, 112);
NVSA_OFF(NVOS32_PARAMETERS, data.AllocSize.address, 120);
NVSA_OFF(NVOS32_PARAMETERS, data.Free.hMemory, 44);
NVSA_OFF(NVOS32_PARAMETERS, data.Free.flags, 48);
#define NVOS32_FUNCTION_ALLOC_SIZE 2
#define NVOS32_FUNCTION_FREE 3

typedef struct {
    NvHandle hClient;
    NvHandle hDevice;
    NvHandle hMemory;
    NvU64A offset;
    NvU64A length;
    NvP64 pLinearAddress;
    NvU32 status;
    NvU32 flags;
} NVOS33_PARAMETERS;
NVSA_SIZE(NVOS33_PARAMETERS, 48);
NVSA_OFF(NVOS33_PARAMETERS, offset, 16);
NVSA_OFF(NVOS33_PARAMETERS, length, 24);
NVSA_OFF(NVOS33_PARAMETERS, pLinearAddress, 32);
NVSA_OFF(NVOS33_PARAMETERS, status, 40);
NVSA_OFF(NVOS33_PARAMETERS, flags, 44);

typedef struct {
    NVOS33_PARAMETERS params;
    int fd;
} nv_ioctl_nvos33_parameters_with_fd;
NVSA_SIZE(nv_ioctl_nvos33_parameters_with_fd, 56);
NVSA_OFF(nv_ioctl_nvos33_parameters_with_fd, fd, 48);

typedef struct {
    NvHandle hClient;
    NvHandle hDevice;
    NvHandle hMemory;
    NvP64 pLinearAddress;
    NvU32 status;
    NvU32 flags;
} NVOS34_PARAMETERS;
NVSA_SIZE(NVOS34_PARAMETERS, 32);
NVSA_OFF(NVOS34_PARAMETERS, pLinearAddress, 16);
NVSA_OFF(NVOS34_PARAMETERS, status, 24);
NVSA_OFF(NVOS34_PARAMETERS, flags, 28);

typedef struct {
    NvHandle hClient;
    NvHandle hObject;
    NvV32 cmd;
    NvU32 flags;
    NvP64 params;
    NvU32 paramsSize;
    NvV32 status;
} NVOS54_PARAMETERS;
NVSA_SIZE(NVOS54_PARAMETERS, 32);
NVSA_OFF(NVOS54_PARAMETERS, cmd, 8);
NVSA_OFF(NVOS54_PARAMETERS, params, 16);
NVSA_OFF(NVOS54_PARAMETERS, paramsSize, 24);
NVSA_OFF(NVOS54_PARAMETERS, status, 28);

typedef struct {
    NvHandle hClient;
    NvHandle hParent;
    NvHandle hObject;
    NvHandle hClientSrc;
    NvHandle hObjectSrc;
    NvU32 flags;
    NvU32 status;
} NVOS55_PARAMETERS;
NVSA_SIZE(NVOS55_PARAMETERS, 28);
NVSA_OFF(NVOS55_PARAMETERS, hObjectSrc, 16);
NVSA_OFF(NVOS55_PARAMETERS, status, 24);

typedef struct {
    NvU32 cmd;
    NvU32 size;
    NvP64 ptr;
} nv_ioctl_xfer_t;
NVSA_SIZE(nv_ioctl_xfer_t, 16);
NVSA_OFF(nv_ioctl_xfer_t, ptr, 8);

/* The ioctl command words; the kernel derives the copy size from them. */
#define NV_IOCTL_RM_ALLOC_MEMORY _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC_MEMORY, nv_ioctl_nvos02_parameters_with_fd)
#define NV_IOCTL_RM_FREE _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_FREE, NVOS00_PARAMETERS)
#define NV_IOCTL_RM_CONTROL _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_CONTROL, NVOS54_PARAMETERS)
#define NV_IOCTL_RM_ALLOC_NVOS21 _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, NVOS21_PARAMETERS)
#define NV_IOCTL_RM_ALLOC_NVOS64 _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, NVOS64_PARAMETERS)
#define NV_IOCTL_RM_DUP_OBJECT _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_DUP_OBJECT, NVOS55_PARAMETERS)
#define NV_IOCTL_RM_VID_HEAP_CONTROL _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_VID_HEAP_CONTROL, NVOS32_PARAMETERS)
#define NV_IOCTL_RM_MAP_MEMORY _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_MAP_MEMORY, nv_ioctl_nvos33_parameters_with_fd)
#define NV_IOCTL_RM_UNMAP_MEMORY _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_UNMAP_MEMORY, NVOS34_PARAMETERS)
#define NV_IOCTL_XFER_CMD _IOWR(NV_IOCTL_MAGIC, NV_ESC_IOCTL_XFER_CMD, nv_ioctl_xfer_t)
/* Values from the facts file's table, so a typo in a struct above cannot hide. */
_Static_assert(NV_IOCTL_RM_ALLOC_MEMORY == 0xc0384627u, "RM_ALLOC_MEMORY cmd");
_Static_assert(NV_IOCTL_RM_FREE == 0xc0104629u, "RM_FREE cmd");
_Static_assert(NV_IOCTL_RM_CONTROL == 0xc020462au, "RM_CONTROL cmd");
_Static_assert(NV_IOCTL_RM_ALLOC_NVOS21 == 0xc020462bu, "RM_ALLOC NVOS21 cmd");
_Static_assert(NV_IOCTL_RM_ALLOC_NVOS64 == 0xc030462bu, "RM_ALLOC NVOS64 cmd");
_Static_assert(NV_IOCTL_RM_DUP_OBJECT == 0xc01c4634u, "RM_DUP_OBJECT cmd");
_Static_assert(NV_IOCTL_RM_VID_HEAP_CONTROL == 0xc0b8464au, "RM_VID_HEAP_CONTROL cmd");
_Static_assert(NV_IOCTL_RM_MAP_MEMORY == 0xc038464eu, "RM_MAP_MEMORY cmd");
_Static_assert(NV_IOCTL_RM_UNMAP_MEMORY == 0xc020464fu, "RM_UNMAP_MEMORY cmd");
_Static_assert(NV_IOCTL_XFER_CMD == 0xc01046d3u, "XFER cmd");

/* ---- classes (section 2.4) ---- */
#define NV01_ROOT 0x0u
#define NV01_ROOT_NON_PRIV 0x1u
#define NV01_ROOT_CLIENT 0x41u
#define NV01_DEVICE_0 0x80u
#define NV20_SUBDEVICE_0 0x2080u
#define FERMI_VASPACE_A 0x90F1u
#define NV01_MEMORY_SYSTEM 0x3Eu
#define NV01_MEMORY_LOCAL_USER 0x40u
#define NV01_MEMORY_VIRTUAL 0x70u
#define NV01_MEMORY_SYSTEM_OS_DESCRIPTOR 0x71u
#define NV50_MEMORY_VIRTUAL 0x50A0u

typedef struct {
    NvU32 owner;
    NvU32 type;
    NvU32 flags;
    NvU32 width;
    NvU32 height;
    NvS32 pitch;
    NvU32 attr;
    NvU32 attr2;
    NvU32 format;
    NvU32 comprCovg;
    NvU32 zcullCovg;
    NvU64A rangeLo;
    NvU64A rangeHi;
    NvU64A size;
    NvU64A alignment;
    NvU64A offset;
    NvU64A limit;
    NvP64 address;
    NvU32 ctagOffset;
    NvHandle hVASpace;
    NvU32 internalflags;
    NvU32 tag;
    NvS32 numaNode;
} NV_MEMORY_ALLOCATION_PARAMS;
NVSA_SIZE(NV_MEMORY_ALLOCATION_PARAMS, 128);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, attr, 24);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, attr2, 28);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, zcullCovg, 40);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, rangeLo, 48);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, size, 64);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, alignment, 72);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, offset, 80);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, limit, 88);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, address, 96);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, ctagOffset, 104);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, hVASpace, 108);
NVSA_OFF(NV_MEMORY_ALLOCATION_PARAMS, numaNode, 120);

#define NVOS32_ATTR_PAGE_SIZE(a) (((a) >> 23) & 3u) /* DEFAULT 0, 4KB 1, BIG 2, HUGE 3 */
#define NVOS32_ATTR_PAGE_SIZE_HUGE (3u << 23)
#define NVOS32_ATTR_LOCATION(a) (((a) >> 25) & 3u) /* VIDMEM 0, PCI 1, ANY 3 */
#define NVOS32_ATTR_LOCATION_PCI (1u << 25)
#define NVOS32_ATTR_LOCATION_VIDMEM_V 0u
#define NVOS32_ATTR_LOCATION_PCI_V 1u
#define NVOS32_ATTR2_PAGE_SIZE_HUGE(a2) (((a2) >> 20) & 3u) /* 2MB 1, 512MB 2, 256GB 3 */
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB (1u << 20)
#define NVOS32_ALLOC_FLAGS_VIRTUAL 0x80000u

/* Not in facts: cl0080.h / cl2080.h / nvos.h. The stand-in reads only deviceId. */
typedef struct {
    NvU32 deviceId;
    NvHandle hClientShare;
    NvHandle hTargetClient;
    NvHandle hTargetDevice;
    NvV32 flags;
    NvU64A vaSpaceSize;
    NvU64A vaStartInternal;
    NvU64A vaLimitInternal;
    NvV32 vaMode;
} NV0080_ALLOC_PARAMETERS;
typedef struct {
    NvU32 subDeviceId;
} NV2080_ALLOC_PARAMETERS;
typedef struct {
    NvU32 index;
    NvU32 flags;
    NvU64A vaSize;
    NvU64A vaStartInternal;
    NvU64A vaLimitInternal;
    NvU32 bigPageSize;
    NvU64A vaBase;
} NV_VASPACE_ALLOCATION_PARAMETERS;

/* Controls the workload issues (not in facts: ctrl0080gpu.h, ctrl2080fb.h). */
#define NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES 0x00800280u
typedef struct {
    NvU32 numSubDevices;
} NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS;
#define NV2080_CTRL_CMD_FB_GET_INFO_V2 0x20801303u
#define NV2080_CTRL_FB_INFO_MAX_LIST_SIZE 0x80u
typedef struct {
    NvU32 fbInfoListSize;
    struct {
        NvU32 index;
        NvU32 data;
    } fbInfoList[NV2080_CTRL_FB_INFO_MAX_LIST_SIZE];
} NV2080_CTRL_FB_GET_INFO_V2_PARAMS;
NVSA_SIZE(NV2080_CTRL_FB_GET_INFO_V2_PARAMS, 1028);
/* The driver the stand-in answers as (standin.py DRIVER_VERSION says the same). */
#define STANDIN_DRIVER_VERSION "580.142"

/* ---- UVM (sections 1.2-1.4), driver 580 ---- */
typedef struct {
    NvU8 uuid[16];
} NvProcessorUuid;

typedef struct {
    NvProcessorUuid gpuUuid;
    NvU32 gpuMappingType;
    NvU32 gpuCachingType;
    NvU32 gpuFormatType;
    NvU32 gpuElementBits;
    NvU32 gpuCompressionType;
} UvmGpuMappingAttributes;
NVSA_SIZE(UvmGpuMappingAttributes, 36);
#define UVM_MAX_GPUS 256

#define UVM_INITIALIZE 0x30000001u
#define UVM_DEINITIALIZE 0x30000002u
#define UVM_REGISTER_GPU_VASPACE 25u
#define UVM_MAP_EXTERNAL_ALLOCATION 33u
#define UVM_FREE 34u
#define UVM_REGISTER_GPU 37u
#define UVM_PAGEABLE_MEM_ACCESS 39u
#define UVM_SET_PREFERRED_LOCATION 42u
#define UVM_SET_ACCESSED_BY 46u
#define UVM_MIGRATE 51u
#define UVM_ALLOC_SEMAPHORE_POOL 68u
#define UVM_CREATE_EXTERNAL_RANGE 73u
#define UVM_MM_INITIALIZE 75u

typedef struct {
    NvU64A flags;
    NV_STATUS rmStatus;
} UVM_INITIALIZE_PARAMS;
NVSA_SIZE(UVM_INITIALIZE_PARAMS, 16);
NVSA_OFF(UVM_INITIALIZE_PARAMS, rmStatus, 8);

typedef struct {
    NvS32 uvmFd;
    NV_STATUS rmStatus;
} UVM_MM_INITIALIZE_PARAMS;
NVSA_SIZE(UVM_MM_INITIALIZE_PARAMS, 8);
NVSA_OFF(UVM_MM_INITIALIZE_PARAMS, rmStatus, 4);

typedef struct {
    NvProcessorUuid gpu_uuid;
    NvBool numaEnabled;
    NvS32 numaNodeId;
    NvS32 rmCtrlFd;
    NvHandle hClient;
    NvHandle hSmcPartRef;
    NV_STATUS rmStatus;
} UVM_REGISTER_GPU_PARAMS;
NVSA_SIZE(UVM_REGISTER_GPU_PARAMS, 40);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, numaEnabled, 16);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, numaNodeId, 20);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, rmCtrlFd, 24);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, hClient, 28);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, hSmcPartRef, 32);
NVSA_OFF(UVM_REGISTER_GPU_PARAMS, rmStatus, 36);

typedef struct {
    NvProcessorUuid gpuUuid;
    NvS32 rmCtrlFd;
    NvHandle hClient;
    NvHandle hVaSpace;
    NV_STATUS rmStatus;
} UVM_REGISTER_GPU_VASPACE_PARAMS;
NVSA_SIZE(UVM_REGISTER_GPU_VASPACE_PARAMS, 32);
NVSA_OFF(UVM_REGISTER_GPU_VASPACE_PARAMS, hVaSpace, 24);
NVSA_OFF(UVM_REGISTER_GPU_VASPACE_PARAMS, rmStatus, 28);

typedef struct {
    NvU64A base;
    NvU64A length;
    NV_STATUS rmStatus;
} UVM_CREATE_EXTERNAL_RANGE_PARAMS;
NVSA_SIZE(UVM_CREATE_EXTERNAL_RANGE_PARAMS, 24);
NVSA_OFF(UVM_CREATE_EXTERNAL_RANGE_PARAMS, rmStatus, 16);

typedef struct {
    NvU64A base;
    NvU64A length;
    NvU64A offset;
    UvmGpuMappingAttributes perGpuAttributes[UVM_MAX_GPUS];
    NvU64A gpuAttributesCount;
    NvS32 rmCtrlFd;
    NvU32 hClient;
    NvU32 hMemory;
    NV_STATUS rmStatus;
} UVM_MAP_EXTERNAL_ALLOCATION_PARAMS;
NVSA_SIZE(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, 9264);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, perGpuAttributes, 24);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, gpuAttributesCount, 9240);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, rmCtrlFd, 9248);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hClient, 9252);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hMemory, 9256);
NVSA_OFF(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, rmStatus, 9260);

/* 580 layout: `length` was removed only in 590.44.01 (facts section 1.4). */
typedef struct {
    NvU64A base;
    NvU64A length;
    NV_STATUS rmStatus;
} UVM_FREE_PARAMS;
NVSA_SIZE(UVM_FREE_PARAMS, 24);
NVSA_OFF(UVM_FREE_PARAMS, rmStatus, 16);

typedef struct {
    NvU64A requestedBase;
    NvU64A length;
    NvProcessorUuid preferredLocation;
    NvS32 preferredCpuNumaNode;
    NV_STATUS rmStatus;
} UVM_SET_PREFERRED_LOCATION_PARAMS;
NVSA_SIZE(UVM_SET_PREFERRED_LOCATION_PARAMS, 40);
NVSA_OFF(UVM_SET_PREFERRED_LOCATION_PARAMS, preferredCpuNumaNode, 32);
NVSA_OFF(UVM_SET_PREFERRED_LOCATION_PARAMS, rmStatus, 36);

typedef struct {
    NvU64A requestedBase;
    NvU64A length;
    NvProcessorUuid accessedByUuid;
    NV_STATUS rmStatus;
} UVM_SET_ACCESSED_BY_PARAMS;
NVSA_SIZE(UVM_SET_ACCESSED_BY_PARAMS, 40);
NVSA_OFF(UVM_SET_ACCESSED_BY_PARAMS, rmStatus, 32);

typedef struct {
    NvBool pageableMemAccess;
    NV_STATUS rmStatus;
} UVM_PAGEABLE_MEM_ACCESS_PARAMS;
NVSA_SIZE(UVM_PAGEABLE_MEM_ACCESS_PARAMS, 8);
NVSA_OFF(UVM_PAGEABLE_MEM_ACCESS_PARAMS, rmStatus, 4);

typedef struct {
    NvU64A base;
    NvU64A length;
    NvProcessorUuid destinationUuid;
    NvU32 flags;
    NvU64A semaphoreAddress;
    NvU32 semaphorePayload;
    NvS32 cpuNumaNode;
    NvU64A userSpaceStart;
    NvU64A userSpaceLength;
    NV_STATUS rmStatus;
} UVM_MIGRATE_PARAMS;
NVSA_SIZE(UVM_MIGRATE_PARAMS, 80);
NVSA_OFF(UVM_MIGRATE_PARAMS, flags, 32);
NVSA_OFF(UVM_MIGRATE_PARAMS, semaphoreAddress, 40);
NVSA_OFF(UVM_MIGRATE_PARAMS, cpuNumaNode, 52);
NVSA_OFF(UVM_MIGRATE_PARAMS, userSpaceStart, 56);
NVSA_OFF(UVM_MIGRATE_PARAMS, rmStatus, 72);

typedef struct {
    NvU64A base;
    NvU64A length;
    UvmGpuMappingAttributes perGpuAttributes[UVM_MAX_GPUS];
    NvU64A gpuAttributesCount;
    NV_STATUS rmStatus;
} UVM_ALLOC_SEMAPHORE_POOL_PARAMS;
NVSA_SIZE(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, 9248);
NVSA_OFF(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, gpuAttributesCount, 9232);
NVSA_OFF(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, rmStatus, 9240);

/*
 * Every routed UVM command at 580 with its parameter size and the offset of rmStatus.
 * The kernel hands a FUSE server no data for these (the cmd word encodes no size), so
 * nvfuse writes rmStatus straight into the caller's struct at this offset.
 */
typedef struct {
    uint32_t cmd;
    const char *name;
    uint32_t size;
    uint32_t status_off; /* UINT32_MAX: the driver writes nothing back */
    int tools_fd;        /* issued on /dev/nvidia-uvm-tools */
} uvm_cmd_info;

#define UVM_CMD_TABLE(X)                                                  \
    X(23, "UVM_CREATE_RANGE_GROUP", 16, 8, 0)                            \
    X(24, "UVM_DESTROY_RANGE_GROUP", 16, 8, 0)                           \
    X(25, "UVM_REGISTER_GPU_VASPACE", 32, 28, 0)                         \
    X(26, "UVM_UNREGISTER_GPU_VASPACE", 20, 16, 0)                       \
    X(27, "UVM_REGISTER_CHANNEL", 56, 48, 0)                             \
    X(28, "UVM_UNREGISTER_CHANNEL", 28, 24, 0)                           \
    X(29, "UVM_ENABLE_PEER_ACCESS", 36, 32, 0)                           \
    X(30, "UVM_DISABLE_PEER_ACCESS", 36, 32, 0)                          \
    X(31, "UVM_SET_RANGE_GROUP", 32, 24, 0)                              \
    X(33, "UVM_MAP_EXTERNAL_ALLOCATION", 9264, 9260, 0)                  \
    X(34, "UVM_FREE", 24, 16, 0)                                         \
    X(37, "UVM_REGISTER_GPU", 40, 36, 0)                                 \
    X(38, "UVM_UNREGISTER_GPU", 20, 16, 0)                               \
    X(39, "UVM_PAGEABLE_MEM_ACCESS", 8, 4, 0)                            \
    X(40, "UVM_PREVENT_MIGRATION_RANGE_GROUPS", 272, 264, 0)             \
    X(41, "UVM_ALLOW_MIGRATION_RANGE_GROUPS", 272, 264, 0)               \
    X(42, "UVM_SET_PREFERRED_LOCATION", 40, 36, 0)                       \
    X(43, "UVM_UNSET_PREFERRED_LOCATION", 24, 16, 0)                     \
    X(44, "UVM_ENABLE_READ_DUPLICATION", 24, 16, 0)                      \
    X(45, "UVM_DISABLE_READ_DUPLICATION", 24, 16, 0)                     \
    X(46, "UVM_SET_ACCESSED_BY", 40, 32, 0)                              \
    X(47, "UVM_UNSET_ACCESSED_BY", 40, 32, 0)                            \
    X(51, "UVM_MIGRATE", 80, 72, 0)                                      \
    X(53, "UVM_MIGRATE_RANGE_GROUP", 32, 24, 0)                          \
    X(54, "UVM_ENABLE_SYSTEM_WIDE_ATOMICS", 20, 16, 0)                   \
    X(55, "UVM_DISABLE_SYSTEM_WIDE_ATOMICS", 20, 16, 0)                  \
    X(56, "UVM_TOOLS_INIT_EVENT_TRACKER", 56, 48, 1)                     \
    X(57, "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD", 8, 4, 1)               \
    X(58, "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS", 16, 8, 1)               \
    X(59, "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS", 16, 8, 1)              \
    X(60, "UVM_TOOLS_ENABLE_COUNTERS", 16, 8, 1)                         \
    X(61, "UVM_TOOLS_DISABLE_COUNTERS", 16, 8, 1)                        \
    X(62, "UVM_TOOLS_READ_PROCESS_MEMORY", 40, 32, 0)                    \
    X(63, "UVM_TOOLS_WRITE_PROCESS_MEMORY", 40, 32, 0)                   \
    X(64, "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE", 16, 8, 0)                \
    X(65, "UVM_MAP_DYNAMIC_PARALLELISM_REGION", 40, 32, 0)               \
    X(66, "UVM_UNMAP_EXTERNAL", 40, 32, 0)                               \
    X(67, "UVM_TOOLS_FLUSH_EVENTS", 4, 0, 0)                             \
    X(68, "UVM_ALLOC_SEMAPHORE_POOL", 9248, 9240, 0)                     \
    X(69, "UVM_CLEAN_UP_ZOMBIE_RESOURCES", 4, 0, 0)                      \
    X(70, "UVM_PAGEABLE_MEM_ACCESS_ON_GPU", 24, 20, 0)                   \
    X(71, "UVM_POPULATE_PAGEABLE", 24, 20, 0)                            \
    X(72, "UVM_VALIDATE_VA_RANGE", 24, 16, 0)                            \
    X(73, "UVM_CREATE_EXTERNAL_RANGE", 24, 16, 0)                        \
    X(74, "UVM_MAP_EXTERNAL_SPARSE", 40, 32, 0)                          \
    X(75, "UVM_MM_INITIALIZE", 8, 4, 0)                                  \
    X(76, "UVM_TOOLS_INIT_EVENT_TRACKER_V2", 56, 48, 1)                  \
    X(77, "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2", 16, 8, 0)             \
    X(78, "UVM_ALLOC_DEVICE_P2P", 56, 52, 0)                             \
    X(79, "UVM_CLEAR_ALL_ACCESS_COUNTERS", 4, 0, 0)                      \
    X(80, "UVM_DISCARD", 32, 24, 0)                                      \
    X(UVM_INITIALIZE, "UVM_INITIALIZE", 16, 8, 0)                        \
    X(UVM_DEINITIALIZE, "UVM_DEINITIALIZE", 0, UINT32_MAX, 0)

/* ---- UVM tools (facts sections 1.3, 5), driver 580 (565+ ABI: separate V1/V2 ioctls) ---- */
#define UVM_TOOLS_INIT_EVENT_TRACKER 56u
#define UVM_TOOLS_SET_NOTIFICATION_THRESHOLD 57u
#define UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS 58u
#define UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS 59u
#define UVM_TOOLS_ENABLE_COUNTERS 60u
#define UVM_TOOLS_DISABLE_COUNTERS 61u
#define UVM_TOOLS_GET_PROCESSOR_UUID_TABLE 64u
#define UVM_TOOLS_FLUSH_EVENTS 67u
#define UVM_TOOLS_INIT_EVENT_TRACKER_V2 76u
#define UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2 77u

typedef struct {
    NvU64A queueBuffer;
    NvU64A queueBufferSize; /* entry count, a power of two >= 2; 0 = counter tracker */
    NvU64A controlBuffer;
    NvProcessorUuid processor;
    NvU32 allProcessors;
    NvU32 uvmFd;
    NV_STATUS rmStatus;
} UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS;
NVSA_SIZE(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, 56);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, queueBufferSize, 8);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, controlBuffer, 16);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, processor, 24);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, allProcessors, 40);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, uvmFd, 44);
NVSA_OFF(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, rmStatus, 48);

typedef struct {
    NvU64A flags; /* eventTypeFlags or counterTypeFlags: bit 1 << type */
    NV_STATUS rmStatus;
} UVM_TOOLS_FLAGS_PARAMS; /* ENABLE/DISABLE_EVENTS and ENABLE/DISABLE_COUNTERS */
NVSA_SIZE(UVM_TOOLS_FLAGS_PARAMS, 16);
NVSA_OFF(UVM_TOOLS_FLAGS_PARAMS, rmStatus, 8);

typedef struct {
    NvU32 notificationThreshold;
    NV_STATUS rmStatus;
} UVM_TOOLS_SET_NOTIFICATION_THRESHOLD_PARAMS;
NVSA_SIZE(UVM_TOOLS_SET_NOTIFICATION_THRESHOLD_PARAMS, 8);

typedef struct {
    NvU64A tablePtr;
    NV_STATUS rmStatus;
} UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_PARAMS;
NVSA_SIZE(UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_PARAMS, 16);
NVSA_OFF(UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_PARAMS, rmStatus, 8);

/*
 * Processor ids (facts section 0, driver's uvm_processors.h): 0 is the CPU. The V1 table
 * and V1 records use parent GPU ids (GPU i -> i + 1, 33 entries); the V2 table and V2
 * records use sub-processor ids (8 per parent: GPU i -> 8 * i + 1, 257 entries). With one
 * GPU both give index 1, as seen on the H200.
 */
#define UVM_MAX_PROCESSORS_V1 33u
#define UVM_MAX_PROCESSORS_V2 257u
#define UVM_SUB_PROCESSORS 8u
#define UVM_V1_GPU_ID(i) ((i) + 1u)
#define UVM_V2_GPU_ID(i) (UVM_SUB_PROCESSORS * (i) + 1u)
#define UVM_PROCESSOR_MASK_WORDS 5u /* (257 + 63) / 64 */
/* NV_PROCESSOR_UUID_CPU_DEFAULT, entry 0 of both tables (the driver's nvCpuUuid.c). */
#define NV_PROCESSOR_UUID_CPU_DEFAULT_BYTES {0xa6, 0x5e, 0x0f, 0x4e, 0xd7, 0xd4, 0x7b, 0xa2, \
                                             0x50, 0x47, 0x41, 0x2c, 0x14, 0x2a, 0x77, 0x73}

/* UvmToolsEventControlData (528 B, facts 5.2): indices are entry indices modulo the count. */
#define UVM_EVENT_NUM_TYPES_ALL 64u
typedef struct {
    NvU32 get_ahead;
    NvU32 get_behind;
    NvU32 put_ahead;
    NvU32 put_behind;
    NvU64A dropped[UVM_EVENT_NUM_TYPES_ALL];
} UvmToolsEventControlData;
NVSA_SIZE(UvmToolsEventControlData, 528);
NVSA_OFF(UvmToolsEventControlData, put_behind, 12);
NVSA_OFF(UvmToolsEventControlData, dropped, 16);

/* UvmCounterName; a counter tracker's control buffer holds UVM_TOTAL_COUNTERS u64s. */
#define UVM_TOTAL_COUNTERS 10u
#define UVM_COUNTER_BYTES_HTD 0u
#define UVM_COUNTER_BYTES_DTH 1u
#define UVM_COUNTER_CPU_FAULTS 2u
#define UVM_COUNTER_PREFETCH_BYTES_HTD 7u
#define UVM_COUNTER_PREFETCH_BYTES_DTH 8u
#define UVM_COUNTER_GPU_FAULTS 9u

/* UvmEventType (facts 5.1) */
#define UVM_EV_CPU_FAULT 1u
#define UVM_EV_MIGRATION 2u
#define UVM_EV_GPU_FAULT 3u
#define UVM_EV_GPU_FAULT_REPLAY 4u
#define UVM_EV_FATAL_FAULT 6u
#define UVM_EV_READ_DUPLICATE 7u
#define UVM_EV_READ_DUPLICATE_INVALIDATE 8u
#define UVM_EV_THRASHING_DETECTED 10u
#define UVM_EV_THROTTLING_START 11u
#define UVM_EV_THROTTLING_END 12u
#define UVM_EV_MAP_REMOTE 13u
/* UvmEventMemoryAccessType, UvmEventFaultType, UvmEventMigrationCause, UvmEventMapRemoteCause */
#define UVM_ACCESS_READ 1u
#define UVM_ACCESS_WRITE 2u
#define UVM_ACCESS_ATOMIC 3u
#define UVM_ACCESS_PREFETCH 4u
#define UVM_FAULT_INVALID_PDE 1u
#define UVM_FAULT_INVALID_PTE 2u
#define UVM_FAULT_WRITE 3u
#define UVM_CAUSE_USER 1u
#define UVM_CAUSE_COHERENCE 2u
#define UVM_CAUSE_PREFETCH 3u
#define UVM_CAUSE_EVICTION 4u
#define UVM_MAP_REMOTE_CAUSE_THRASHING 2u
#define UVM_CLIENT_TYPE_GPC 1u /* replayable (UvmEventFaultClientTypeGpc) */

/* Event records, V1 (64-byte queue entries) then V2 (72-byte entries), driver 580. */
typedef struct {
    NvU8 eventType, accessType;
    NvU16 pad;
    NvU32 cpuId;
    NvU64A address, timeStamp;
    NvU32 pid, threadId;
    NvU64A pc;
} UvmEventCpuFaultInfo; /* the same struct in both entry versions */
NVSA_SIZE(UvmEventCpuFaultInfo, 40);
NVSA_OFF(UvmEventCpuFaultInfo, cpuId, 4);
NVSA_OFF(UvmEventCpuFaultInfo, pid, 24);
NVSA_OFF(UvmEventCpuFaultInfo, pc, 32);

typedef struct {
    NvU8 eventType, migrationCause, srcIndex, dstIndex;
    NvU32 pad;
    NvU64A address, migratedBytes, beginTimeStamp, endTimeStamp, rangeGroupId;
    NvU64A beginTimeStampGpu, endTimeStampGpu;
} UvmEventMigrationInfo_V1;
NVSA_SIZE(UvmEventMigrationInfo_V1, 64);
NVSA_OFF(UvmEventMigrationInfo_V1, migratedBytes, 16);
NVSA_OFF(UvmEventMigrationInfo_V1, endTimeStampGpu, 56);
typedef struct {
    NvU8 eventType, migrationCause;
    NvU16 pad, srcIndex, dstIndex;
    NvS32 srcNid, dstNid;
    NvU64A address, migratedBytes, beginTimeStamp, endTimeStamp, rangeGroupId;
    NvU64A beginTimeStampGpu, endTimeStampGpu;
} UvmEventMigrationInfo_V2;
NVSA_SIZE(UvmEventMigrationInfo_V2, 72);
NVSA_OFF(UvmEventMigrationInfo_V2, srcIndex, 4);
NVSA_OFF(UvmEventMigrationInfo_V2, address, 16);
NVSA_OFF(UvmEventMigrationInfo_V2, endTimeStampGpu, 64);

typedef struct {
    NvU8 eventType, faultType, accessType, gpuIndex;
    NvU16 gpcId, clientId;
    NvU64A address, timeStamp, timeStampGpu;
    NvU32 batchId;
    NvU8 clientType, pad8;
    NvU16 pad16;
} UvmEventGpuFaultInfo_V1;
NVSA_SIZE(UvmEventGpuFaultInfo_V1, 40);
NVSA_OFF(UvmEventGpuFaultInfo_V1, gpuIndex, 3);
NVSA_OFF(UvmEventGpuFaultInfo_V1, batchId, 32);
NVSA_OFF(UvmEventGpuFaultInfo_V1, clientType, 36);
typedef struct {
    NvU8 eventType, faultType;
    NvU16 gpuIndex, gpcId, clientId;
    NvU64A address, timeStamp, timeStampGpu;
    NvU32 batchId;
    NvU8 clientType, accessType;
    NvU16 pad16;
} UvmEventGpuFaultInfo_V2;
NVSA_SIZE(UvmEventGpuFaultInfo_V2, 40);
NVSA_OFF(UvmEventGpuFaultInfo_V2, gpuIndex, 2);
NVSA_OFF(UvmEventGpuFaultInfo_V2, clientId, 6);
NVSA_OFF(UvmEventGpuFaultInfo_V2, batchId, 32);
NVSA_OFF(UvmEventGpuFaultInfo_V2, accessType, 37);

typedef struct {
    NvU8 eventType, gpuIndex, clientType, pad8;
    NvU32 batchId;
    NvU64A timeStamp, timeStampGpu;
} UvmEventGpuFaultReplayInfo_V1;
NVSA_SIZE(UvmEventGpuFaultReplayInfo_V1, 24);
NVSA_OFF(UvmEventGpuFaultReplayInfo_V1, batchId, 4);
typedef struct {
    NvU8 eventType, clientType;
    NvU16 gpuIndex;
    NvU32 batchId;
    NvU64A timeStamp, timeStampGpu;
} UvmEventGpuFaultReplayInfo_V2;
NVSA_SIZE(UvmEventGpuFaultReplayInfo_V2, 24);
NVSA_OFF(UvmEventGpuFaultReplayInfo_V2, gpuIndex, 2);

typedef struct {
    NvU8 eventType, pad8;
    NvU16 pad16;
    NvU32 pad32;
    NvU64A processors, address, size, timeStamp;
} UvmEventThrashingDetectedInfo_V1;
NVSA_SIZE(UvmEventThrashingDetectedInfo_V1, 40);
typedef struct {
    NvU8 eventType, pad8;
    NvU16 pad16;
    NvU32 pad32;
    NvU64A address, size, timeStamp;
    NvU64A processors[UVM_PROCESSOR_MASK_WORDS];
} UvmEventThrashingDetectedInfo_V2;
NVSA_SIZE(UvmEventThrashingDetectedInfo_V2, 72);
NVSA_OFF(UvmEventThrashingDetectedInfo_V2, processors, 32);

typedef struct {
    NvU8 eventType, processorIndex;
    NvU16 pad16;
    NvU32 pad32;
    NvU64A address, timeStamp;
} UvmEventThrottlingInfo_V1; /* ThrottlingStart and ThrottlingEnd */
NVSA_SIZE(UvmEventThrottlingInfo_V1, 24);
typedef struct {
    NvU8 eventType, pad8;
    NvU16 processorIndex;
    NvU32 pad32;
    NvU64A address, timeStamp;
} UvmEventThrottlingInfo_V2;
NVSA_SIZE(UvmEventThrottlingInfo_V2, 24);

typedef struct {
    NvU8 eventType, srcIndex, dstIndex, mapRemoteCause;
    NvU32 pad32;
    NvU64A address, size, timeStamp, timeStampGpu;
} UvmEventMapRemoteInfo_V1;
NVSA_SIZE(UvmEventMapRemoteInfo_V1, 40);
typedef struct {
    NvU8 eventType, mapRemoteCause;
    NvU16 pad16, srcIndex, dstIndex;
    NvU64A address, size, timeStamp, timeStampGpu;
} UvmEventMapRemoteInfo_V2;
NVSA_SIZE(UvmEventMapRemoteInfo_V2, 40);
NVSA_OFF(UvmEventMapRemoteInfo_V2, srcIndex, 4);
NVSA_OFF(UvmEventMapRemoteInfo_V2, address, 8);

#define UVM_ENTRY_SIZE_V1 64u
#define UVM_ENTRY_SIZE_V2 72u

/*
 * ---- NOT PART OF THE REAL PROTOCOL: stand-in-only command on nvidia-uvm ----
 * UVM_STANDIN_TEST drives the stand-in's managed-memory model (README "test command").
 * No real driver routes this number; on a real driver it fails like any unrouted cmd.
 */
#define UVM_STANDIN_TEST 0x5e57u /* no _IOC size bits: FUSE must pass the pointer only */
#define UVM_STANDIN_IDENTIFY 0x5e58u /* the server's own probe; refused from others */
enum standin_op {
    STANDIN_OP_REGISTER_RANGE = 1, /* base, length: a managed range the workload mmap'ed */
    STANDIN_OP_CPU_TOUCH = 2,      /* base, length, access: the workload touched these pages */
    STANDIN_OP_GPU_KERNEL = 3,     /* gpu, base, length, access, batch, dup_every, prefetch */
    STANDIN_OP_MIGRATE = 4,        /* base, length, dest (0 = CPU, g + 1 = GPU g): cause user */
    STANDIN_OP_SET_CAPACITY = 5,   /* gpu, length = managed bytes the GPU holds (0 = no limit) */
};
typedef struct {
    NvU32 op;
    NvU32 gpu;
    NvU64A base;
    NvU64A length;
    NvU32 access;    /* UvmEventMemoryAccessType of the touches */
    NvU32 batch;     /* GPU kernel: unique faults per fault batch (>= 1) */
    NvU32 dup_every; /* GPU kernel: every dup_every-th fault is reported twice (0: none) */
    NvU32 prefetch;  /* GPU kernel: prefetch region in pages, a power of two (0: off) */
    NvU32 dest;      /* MIGRATE: 0 = CPU, g + 1 = GPU g */
    NV_STATUS rmStatus;
} UVM_STANDIN_TEST_PARAMS;
NVSA_SIZE(UVM_STANDIN_TEST_PARAMS, 48);
NVSA_OFF(UVM_STANDIN_TEST_PARAMS, rmStatus, 44);
#define STANDIN_PAGE 4096ull
#define STANDIN_THRASH_THRESHOLD 3u /* migrations of one page before thrashing is detected */

/* ---- RM: what nvidia-smi's open sequence and the recorder's sampling use ---- */
#define NV_ESC_CARD_INFO 200
#define NV_ESC_CHECK_VERSION_STR 210
#define NV_ESC_WAIT_OPEN_COMPLETE 218
typedef struct {
    NvU32 cmd;
    NvU32 reply;
    char versionString[64];
} nv_ioctl_rm_api_version_t;
NVSA_SIZE(nv_ioctl_rm_api_version_t, 72);
#define NV_RM_API_VERSION_REPLY_RECOGNIZED 1u
typedef struct {
    int ctl_fd;
} nv_ioctl_register_fd_t;
typedef struct {
    int rc;
    NvU32 adapterStatus;
} nv_ioctl_wait_open_complete_t;
NVSA_SIZE(nv_ioctl_wait_open_complete_t, 8);
#define NV_IOCTL_CHECK_VERSION_STR _IOWR(NV_IOCTL_MAGIC, NV_ESC_CHECK_VERSION_STR, nv_ioctl_rm_api_version_t)
#define NV_IOCTL_REGISTER_FD _IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, nv_ioctl_register_fd_t)
#define NV_IOCTL_WAIT_OPEN_COMPLETE _IOWR(NV_IOCTL_MAGIC, NV_ESC_WAIT_OPEN_COMPLETE, nv_ioctl_wait_open_complete_t)

/* NV0000 (root client) controls, ctrl0000gpu.h */
#define NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS 0x201u
#define NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 0x205u
#define NV0000_CTRL_CMD_GPU_GET_PROBED_IDS 0x214u
#define NV0000_CTRL_CMD_GPU_ATTACH_IDS 0x215u
#define NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID 0x275u
#define NV0000_CTRL_GPU_MAX_PROBED_GPUS 32u
#define NV0000_CTRL_GPU_INVALID_ID 0xffffffffu
typedef struct {
    NvU32 gpuIds[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
    NvU32 excludedGpuIds[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
    NvU32 gpuFlags[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
} NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS;
NVSA_SIZE(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS, 384);
typedef struct {
    NvU32 gpuIds[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
    NvU32 failedId;
} NV0000_CTRL_GPU_ATTACH_IDS_PARAMS;
NVSA_SIZE(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS, 132);
typedef struct {
    NvU32 gpuId, gpuFlags, deviceInstance, subDeviceInstance, sliStatus, boardId, gpuInstance;
    NvS32 numaId;
} NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
NVSA_SIZE(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, 32);
typedef struct {
    NvU32 gpuId;
    NvU32 flags; /* FORMAT bits 1:0: ASCII 0, BINARY 2 */
    NvU8 gpuUuid[256];
    NvU32 uuidStrLen;
} NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS;
NVSA_SIZE(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, 268);
/* NV2080 (subdevice) GID: the GPU UUID, binary (16 bytes) or ASCII "GPU-xxxxxxxx-...". */
#define NV2080_CTRL_CMD_GPU_GET_GID_INFO 0x2080014au
typedef struct {
    NvU32 index;
    NvU32 flags;
    NvU32 length;
    NvU8 data[256];
} NV2080_CTRL_GPU_GET_GID_INFO_PARAMS;
NVSA_SIZE(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, 268);
/* NV2080 per-process memory, as nvidia-smi lists processes (ctrl2080gpu.h, tag 580.142;
 * docs/driver-facts.md §2; the recorder's mirror is gputrace/record/rm_query/abi.py). */
#define NV2080_CTRL_CMD_GPU_GET_PIDS 0x2080018du
#define NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT 950u
#define NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS 0u
typedef struct {
    NvU32 idType;
    NvU32 id;
    NvU32 pidTblCount;
    NvU32 pidTbl[NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT];
} NV2080_CTRL_GPU_GET_PIDS_PARAMS;
NVSA_SIZE(NV2080_CTRL_GPU_GET_PIDS_PARAMS, 3812);
#define NV2080_CTRL_CMD_GPU_GET_PID_INFO 0x2080018eu
#define NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT 200u
#define NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE 0u
typedef struct {
    NvU64 memPrivate __attribute__((aligned(8)));
    NvU64 memSharedOwned __attribute__((aligned(8)));
    NvU64 memSharedDuped __attribute__((aligned(8)));
    NvU64 protectedMemPrivate __attribute__((aligned(8)));
    NvU64 protectedMemSharedOwned __attribute__((aligned(8)));
    NvU64 protectedMemSharedDuped __attribute__((aligned(8)));
} NV2080_CTRL_GPU_PID_INFO_VIDEO_MEMORY_USAGE_DATA;
typedef struct {
    NvU32 pid;
    NvU32 index;
    NvU32 result;
    NV2080_CTRL_GPU_PID_INFO_VIDEO_MEMORY_USAGE_DATA data __attribute__((aligned(8)));
    struct {
        NvU32 computeInstanceId;
        NvU32 gpuInstanceId;
    } smcSubscription;
} NV2080_CTRL_GPU_PID_INFO;
NVSA_SIZE(NV2080_CTRL_GPU_PID_INFO, 72);
NVSA_OFF(NV2080_CTRL_GPU_PID_INFO, data, 16);
typedef struct {
    NvU32 pidInfoListCount;
    NV2080_CTRL_GPU_PID_INFO pidInfoList[NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT]
        __attribute__((aligned(8)));
} NV2080_CTRL_GPU_GET_PID_INFO_PARAMS;
NVSA_SIZE(NV2080_CTRL_GPU_GET_PID_INFO_PARAMS, 14408);
#define NV_GID_FLAGS_FORMAT_BINARY 2u
/* The stand-in's RM GPU ids: GPU i is 0x100 * (i + 1) (real ids are PCI-derived, e.g. 0x6). */
#define STANDIN_GPU_ID(i) (0x100u * ((NvU32)(i) + 1u))

/* FB_GET_INFO_V2 indices answered from the heap model (ctrl2080fb.h); values in KiB. */
#define NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE 0x07u
#define NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE 0x08u
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE 0x09u
#define NV2080_CTRL_FB_INFO_INDEX_FB_TAX_SIZE_KB 0x10u
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_BASE_KB 0x11u
#define NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB 0x12u
#define NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_BASE_KB 0x13u
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE 0x16u
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_START 0x1Eu
#define NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE 0x20u
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_OFFLINE_SIZE 0x27u
#define NV2080_CTRL_FB_INFO_INDEX_MAX 0x3Bu

/* ====================================================================== */
/* The known workload (workload.c). nvfuse does not use anything below.   */
/* ====================================================================== */

/* Handles the workload chooses; the client handle is chosen by the stand-in. */
#define WL_H_DEVICE 0x5c000001u
#define WL_H_SUBDEVICE 0x5c000002u
#define WL_H_VASPACE 0x5c000003u
/* Per repetition r, memory handles are WL_H_MEM_BASE + r * WL_H_MEM_STRIDE + index. */
#define WL_H_MEM_BASE 0x5c010000u
#define WL_H_MEM_STRIDE 0x100u

#define WL_MIB (1ull << 20)
#define WL_GIB (1ull << 30)
#define WL_TIB (1ull << 40)

enum wl_fate {
    WL_FREED,     /* RM_FREE'd inside the allocation section */
    WL_KEPT,      /* never RM_FREE'd by handle: freed only with the client or the fd */
    WL_FAILS,     /* RM_ALLOC answers NV_ERR_NO_MEMORY; no object exists */
};

typedef struct {
    uint32_t hclass;
    uint64_t size;
    uint32_t flags;
    uint32_t attr;
    uint32_t attr2;
    enum wl_fate fate;
    const char *role;
} wl_alloc;

#define WL_VID_ATTR (NVOS32_ATTR_PAGE_SIZE_HUGE)
#define WL_VID_ATTR2 (NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB)
/*
 * One allocation section, in issue order (index = handle offset). The 1 TiB request
 * fails because the stand-in's per-GPU budget must be below 1 TiB (default 16 GiB).
 */
static const wl_alloc WL_ALLOCS[] = {
    {NV01_MEMORY_LOCAL_USER, 2 * WL_MIB, 0, WL_VID_ATTR, WL_VID_ATTR2, WL_FREED, "vidmem, freed"},
    {NV01_MEMORY_LOCAL_USER, 64 * WL_MIB, 0, WL_VID_ATTR, WL_VID_ATTR2, WL_KEPT,
     "vidmem, leaked; RM_DUP_OBJECT source"},
    {NV01_MEMORY_LOCAL_USER, 4 * WL_MIB, 0, WL_VID_ATTR, WL_VID_ATTR2, WL_FREED,
     "vidmem, UVM external mapping, then UVM_FREE + RM_FREE"},
    {NV01_MEMORY_LOCAL_USER, 32 * WL_MIB, 0, WL_VID_ATTR, WL_VID_ATTR2, WL_KEPT, "vidmem, leaked"},
    {NV01_MEMORY_SYSTEM, 1 * WL_MIB, 0, NVOS32_ATTR_LOCATION_PCI, 0, WL_FREED,
     "sysmem, RM_MAP_MEMORY + mmap of nvidia0 + RM_UNMAP_MEMORY, then freed"},
    {NV01_MEMORY_SYSTEM, 128 * 1024, 0, NVOS32_ATTR_LOCATION_PCI, 0, WL_KEPT, "sysmem, leaked"},
    {NV50_MEMORY_VIRTUAL, 256 * WL_MIB, NVOS32_ALLOC_FLAGS_VIRTUAL, 0, 0, WL_KEPT,
     "GPU VA reservation, no physical memory, never freed by handle"},
    {NV01_MEMORY_LOCAL_USER, 1 * WL_TIB, 0, WL_VID_ATTR, WL_VID_ATTR2, WL_FAILS,
     "vidmem over budget: NV_ERR_NO_MEMORY"},
};
#define WL_NALLOCS (sizeof(WL_ALLOCS) / sizeof(WL_ALLOCS[0]))
#define WL_IDX_DUP_SRC 1
#define WL_IDX_UVM_EXT 2
#define WL_IDX_RM_MAP 4
/* Handle offsets of the two objects that are not in the table. */
#define WL_IDX_OSDESC ((uint32_t)WL_NALLOCS)     /* RM_ALLOC_MEMORY class 0x71 on nvidia0, freed */
#define WL_IDX_DUP ((uint32_t)WL_NALLOCS + 1)    /* RM_DUP_OBJECT of WL_IDX_DUP_SRC, freed */
#define WL_OSDESC_SIZE (64 * 1024)

/* UVM virtual addresses. Only the managed range is really mmap'ed. */
#define WL_MANAGED_ADDR 0x200000000000ull
#define WL_MANAGED_LEN (8 * WL_MIB)
#define WL_SEMA_BASE 0x200100000000ull
#define WL_SEMA_LEN (2 * WL_MIB)
#define WL_EXT_BASE 0x200200000000ull
#define WL_EXT_STRIDE 0x10000000ull
/* A UUID the stand-in accepts for GPU 0 (it checks none). */
#define WL_GPU0_UUID {0x47, 0x50, 0x55, 0x2d, 0x73, 0x74, 0x61, 0x6e, \
                      0x64, 0x2d, 0x69, 0x6e, 0x2d, 0x00, 0x00, 0x00}

#endif
