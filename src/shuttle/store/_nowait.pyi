# The C page-cache read (src/shuttle/store/_nowait.c); the reference is nowait.py's
# ReusedBufferPread.

def pread_nowait(fd: int, length: int, offset: int, /) -> bytes: ...
