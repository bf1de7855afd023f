"""Child process for large secret LPs (see secret_lp._linprog_with_deadline): solve and write out.npz."""
import sys

import numpy as np
import scipy.sparse as sp

from components.bounding.secret_lp import _solve


def main(tmp: str, method: str, time_limit_s: float) -> None:
    d = np.load(f"{tmp}/in.npz", allow_pickle=False)
    A = sp.csr_matrix((d["data"], d["indices"], d["indptr"]), shape=tuple(d["shape"]))
    b, bounds = d["b"], d["bounds"]
    print("ready", flush=True)
    res = _solve(A, b, bounds, method, time_limit_s)
    x = res.x if res.x is not None else np.zeros(0)
    np.savez(f"{tmp}/out.npz", status=np.array(res.status), message=np.array(str(res.message)), x=x)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
