"""Faces over the client: unmodified programs read and write Shuttle objects.

A face is to programs what the CLI is to people: it adds no consistency of its own,
only a way in. Reads go through the client cache, the client's validation mode and
its lookaside stores (docs/mount.md).

Layout:

* ``tree``       directories over flat keys (markers for empty ones), rename as copy + remove
* ``oserrors``   Shuttle errors as errno values and ``OSError``s, the same for both faces
* ``reading``    reads for programs that cannot be rolled back: speculative opens confirmed
* ``inodes``     the FUSE mount's inode numbers: which path each names, lookup counts
* ``handles``    open files of the mount: a reader per handle, a write buffer per inode
* ``fuse``       :class:`ShuttleOperations`, the pyfuse3 operations of the mount
* ``fuse_errors`` how a failure in an operation becomes the errno a program sees
* ``space``      the cluster's space as the mount's ``statfs`` reports it
* ``mount``      :func:`serve_mount` (the FUSE loop), :class:`MountProcess` (a mount in a
  child process), :func:`unmount`
* ``fsspec_fs``  :class:`ShuttleFileSystem`, the ``shuttle://`` fsspec filesystem
* ``cli``        ``shuttle mount`` and ``shuttle umount``
"""
