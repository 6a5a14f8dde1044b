worker0"vm(µ8BƒNVIDIA H100 80GB HBM3€€ÀÛ¼ 	0„:İ{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}H€¨øñ ß™íR
cuda_driver13000R
cuda_runtime13000R
cupti130001R
kineto_schema1R
tessera0.1.0R
torch2.11.0+cu130rcapturezÍ{"schemaVersion":1,"trace_id":"9F1FC8B46AEF45628783FF05981725C8","with_stack":1,"profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-437-tojn4oeh/window_000000.json"}‚‘ÖÿÏÚâÉõ ‰“„ÜÚâÉõ(ã‚‰“„ÜÚâÉõ ‘ú¹ãÚâÉõ(»‚‘ú¹ãÚâÉõ Ø…ñêÚâÉõ(İŠ
host_regionsokŠ5
nvmlunavailable not requested (activity 'power')ŠM
ncu_countersunavailable0no-ncu: run tessera-prof counters RUN -- PROGRAMŠ
cpu_opsokŠ
device_activityokŠ
memcpyokŠA
collectivesunavailable%not requested (activity 'collective')Š
memoryokŠ
shapesokŠ
stacksokŠ
torch_profilerok’capture