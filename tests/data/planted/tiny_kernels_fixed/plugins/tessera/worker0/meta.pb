worker0"vm(¬8BÉNVIDIA H100 80GB HBM3ÄÄ¿€º 	0Ñ:›{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}HÄ®¯Ò†ﬂôÌR
kineto_schema1R
torch2.11.0+cu130R
cupti130001R
cuda_runtime13000R
tessera0.1.0R
cuda_driver13000rcapturezæ{"schemaVersion":1,"trace_id":"3FAD1253BE6847F1924D83BB2BFEC0B9","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-578-_gq3pkgp/window_000000.json"}Çª≠≠ã…ª»ı ‡Ó˜ã…ª»ı([ÇŸ˛˘ã…ª»ı –£∫å…ª»ı(YÇ∂Êºå…ª»ı ¨çÔå…ª»ı([ä
host_regionsokä5
nvmlunavailable not requested (activity 'power')ä@
ncu_countersunavailable#no-ncu: run tessera-prof import-ncuä
cpu_opsokä
device_activityokä
memcpyokäA
collectivesunavailable%not requested (activity 'collective')ä
memoryokä
shapesokä'
stacksunavailablewith_stack=Falseä
torch_profilerokícapture