#!/usr/bin/env python3
"""Golden token-block keys from an implementation independent of kvroute's: XXH64 in pure
Python (checked against the reference's known answers) and the scheme as the C header states it
for kvroute_token_block_keys(). Prints the keys that tests/c/test_api.c, ffi/src/tests.rs and
ffi/go/kvroute_test.go expect. Run: python3 tests/c/token_keys_golden.py"""
import struct
M=(1<<64)-1
P1=11400714785074694791;P2=14029467366897019727;P3=1609587929392839161;P4=9650029242287828579;P5=2870177450012600261
def rotl(x,r): return ((x<<r)|(x>>(64-r)))&M
def rnd(acc,inp):
    acc=(acc+inp*P2)&M; acc=rotl(acc,31); return (acc*P1)&M
def merge(acc,v):
    v=rnd(0,v); acc^=v; return (acc*P1+P4)&M
def xxh64(data,seed=0):
    n=len(data); i=0
    if n>=32:
        v1=(seed+P1+P2)&M; v2=(seed+P2)&M; v3=seed; v4=(seed-P1)&M
        while i+32<=n:
            a,b,c,d=struct.unpack_from('<4Q',data,i)
            v1=rnd(v1,a);v2=rnd(v2,b);v3=rnd(v3,c);v4=rnd(v4,d); i+=32
        h=(rotl(v1,1)+rotl(v2,7)+rotl(v3,12)+rotl(v4,18))&M
        h=merge(h,v1);h=merge(h,v2);h=merge(h,v3);h=merge(h,v4)
    else:
        h=(seed+P5)&M
    h=(h+n)&M
    while i+8<=n:
        k=rnd(0,struct.unpack_from('<Q',data,i)[0]); h^=k; h=(rotl(h,27)*P1+P4)&M; i+=8
    if i+4<=n:
        h^=(struct.unpack_from('<I',data,i)[0]*P1)&M; h=(rotl(h,23)*P2+P3)&M; i+=4
    while i<n:
        h^=(data[i]*P5)&M; h=(rotl(h,11)*P1)&M; i+=1
    h^=h>>33; h=(h*P2)&M; h^=h>>29; h=(h*P3)&M; h^=h>>32
    return h
assert xxh64(b'')==0xEF46DB3751D8E999
assert xxh64(b'abc')==0x44BC2CF5AD770999
DOMAIN=0x746f6b656e730001
def keys(tokens,block,seed,lora=None,salt=None):
    out=[];parent=seed^DOMAIN
    for i in range(len(tokens)//block):
        buf=struct.pack('<Q',parent)+b''.join(struct.pack('<I',t) for t in tokens[i*block:(i+1)*block])
        if lora: buf+=b'\x01'+struct.pack('<I',len(lora))+lora.encode()
        if i==0 and salt: buf+=b'\x02'+struct.pack('<I',len(salt))+salt.encode()
        parent=xxh64(buf,seed); out.append(parent)
    return out
# The ids 1..9 in blocks of 4, seed 42, with and without a LoRA adapter and a cache salt.
toks=list(range(1,10))
for args in [(4,42,None,None),(4,42,'sql',None),(4,42,None,'tenant-1'),(4,42,'sql','tenant-1')]:
    print(args,['0x%016x'%k for k in keys(toks,*args)])
# The ids 1000..1039 in blocks of 16, seed 0 (blocks of 72 bytes: XXH64's long path).
print('b16', ['0x%016x'%k for k in keys(list(range(1000,1040)),16,0)])
