module example.invalid/kvroute/ffi/go

go 1.19
