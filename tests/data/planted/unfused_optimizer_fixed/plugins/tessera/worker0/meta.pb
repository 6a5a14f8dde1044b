worker0"vm(¬8BÉNVIDIA H100 80GB HBM3ÄÄ¿€º 	0Ñ:›{"maxThreadsPerBlock":1024,"maxThreadsPerMultiprocessor":2048,"regsPerBlock":65536,"warpSize":32,"sharedMemPerBlock":49152,"regsPerMultiprocessor":65536,"sharedMemPerBlockOptin":232448,"sharedMemPerMultiprocessor":233472}HÄ®¯Ò†ﬂôÌR
cuda_runtime13000R
torch2.11.0+cu130R
tessera0.1.0R
kineto_schema1R
cupti130001R
cuda_driver13000rcapturezæ{"schemaVersion":1,"trace_id":"FED847DB82C349DC9154E84F65692C63","profile_memory":1,"cuda_driver_version":13000,"record_shapes":1,"cuda_runtime_version":13000,"cupti_version":130001,"displayTimeUnit":"ms","baseTimeNanoseconds":1790857026000000000,"traceName":"/dev/shm/tessera-capture-578-29lfen7x/window_000000.json"}ÇÑ‘Üãüª»ı ôˇÑôüª»ı(ä)Ç˚Ïáôüª»ı ä„œßüª»ı(à)Ç˝«”ßüª»ı Ïâç¥üª»ı(ä)ä
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