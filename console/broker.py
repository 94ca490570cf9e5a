"""The embedded broker: kombu's filesystem transport, with message files that appear whole.

kombu writes a message file in place while a worker may already be taking it:
a worker that reads it half-written dies on the broken JSON. Here a message is
written under a name the readers skip and renamed into place (atomic on POSIX).
"""

import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # not a `.msg`: readers pass it by
        with open(partial, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(partial, final)


class Transport(filesystem.Transport):
    Channel = Channel
