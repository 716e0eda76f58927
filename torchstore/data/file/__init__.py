"""The store file on disk: its HDF5 layout, the manifest, the verified read core, the writer.

:mod:`~torchstore.data.file.layout` names where each part of a store lies in the file and
checks it; :mod:`~torchstore.data.file.manifest` is the manifest a store carries (format
version, columns, counts, user metadata); :class:`~torchstore.data.file.reader.StoreReader`
opens a file for (SWMR) reading and reads verified slabs; and
:class:`~torchstore.data.file.writer.TrajectoryStoreWriter` streams episodes in, committing
each one crash-safely; :mod:`~torchstore.data.file.encoded` keeps camera columns as codec
packets and decodes runs of them. Imports the vocabulary of :mod:`torchstore.data`
(columns, episodes, quantisation) and :mod:`torchstore.io`; nothing else of the data layer.
"""
